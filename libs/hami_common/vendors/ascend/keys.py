"""Every Huawei Ascend name, once (hami-vendors §1): annotation keys, user annotations, env vars, words.

Ascend is one backend per chip model, each known by its common word (``Ascend910B3``): most keys are
functions of that word. Resource names come from the ``vnpus`` config (:mod:`.config`); the chart's are
``huawei.com/<CommonWord>``, ``…-memory`` and ``…-core``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Final

# --- words -------------------------------------------------------------------------------------------------
ASCEND_910_PREFIX: Final = "Ascend910"  # every 910 model registers an HCCS NetworkID: topology mode and score
ASCEND_910C: Final = "Ascend910C"  # the SuperPod module chip: two NPUs per card
NPUS_PER_910C_MODULE: Final = 2
NETWORK_WEIGHT: Final = 10  # HAMi's Ascend910NetworkWeight: the node-score bonus per fully grouped container

# --- node annotations --------------------------------------------------------------------------------------
NODE_VNPU_CORE: Final = "hami-vnpu-core"  # "true"/"false": the node runs the hami-vnpu-core soft split
NETWORK_ID: Final = "NetworkID"  # custominfo key of the register JSON (an exact map key, not case-folded)

# The shared HAMi node lock (annotations.keys.NODE_LOCK, hami-protocol §2.7): its takeover age (NodeLockTimeout).
LOCK_EXPIRY: Final = timedelta(minutes=5)


def register_key(word: str) -> str:
    """``hami.io/node-register-<CommonWord>``: the plugin's JSON device list."""
    return f"hami.io/node-register-{word}"


def handshake_key(word: str) -> str:
    """``hami.io/node-handshake-<CommonWord>``: ``Reported_…`` from the plugin, ``Requesting_…`` from us."""
    return f"hami.io/node-handshake-{word}"


# --- pod annotations written at placement ------------------------------------------------------------------
PREDICATE_TIME: Final = "predicate-time"  # Unix seconds of the placement, beside hami.io/vgpu-time


def devices_to_allocate_key(word: str) -> str:
    return f"hami.io/{word}-devices-to-allocate"


def devices_allocated_key(word: str) -> str:
    return f"hami.io/{word}-devices-allocated"


def runtime_key(word: str) -> str:
    """``huawei.com/<CommonWord>``: the JSON list of ``{UUID, temp, memory, core}`` the plugin reads."""
    return f"huawei.com/{word}"


# --- pod annotations set by users --------------------------------------------------------------------------
VNPU_MODE: Final = "huawei.com/vnpu-mode"
MODE_HAMI_CORE: Final = "hami-core"  # soft split; any other value (or none) on a pod is hard split
# What a node that does not run hami-vnpu-core offers (DeviceUsage.mode): hard split by templates.
MODE_TEMPLATE: Final = "template"


def use_uuid_key(word: str) -> str:
    return f"hami.io/use-{word}-uuid"


def nouse_uuid_key(word: str) -> str:
    return f"hami.io/no-use-{word}-uuid"


# --- container env ------------------------------------------------------------------------------------------
# Appended empty by the webhook to a container without this NPU when overwriteEnv is set, so an image's own
# ASCEND_VISIBLE_DEVICES cannot expose NPUs the scheduler never granted.
ASCEND_VISIBLE_DEVICES: Final = "ASCEND_VISIBLE_DEVICES"
