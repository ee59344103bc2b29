"""Scheduling policies and per-pod preferences, read from pod annotations (hami-protocol §2.9, §4.5-4.6).

Everything here is parsed once per pod; the fit and score functions only read the typed result.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from hami_common.annotations.keys import (
    BINPACK,
    DEVICE_CORDON,
    DEVICE_SCORING_WEIGHTS,
    GPU_SCHEDULER_POLICY,
    MUTEX,
    NODE_SCHEDULER_POLICY,
    NOUSE_GPUTYPE,
    NOUSE_GPUUUID,
    NUMA,
    NUMA_BIND,
    SPREAD,
    TOPOLOGY_AWARE,
    USE_GPUTYPE,
    USE_GPUUUID,
    VGPU_MODE,
)
from hami_common.errors import InvalidInput

__all__ = [
    "BINPACK",
    "DEFAULT_SCHEDULER_NAME",
    "MUTEX",
    "NUMA",
    "SPREAD",
    "TOPOLOGY_AWARE",
    "NodePolicy",
    "PodPreferences",
    "SchedulerDefaults",
    "ScoringWeights",
    "cordoned_devices",
    "parse_bool",
    "parse_scoring_weights",
    "preferences_from_annotations",
]


class NodePolicy(enum.StrEnum):
    BINPACK = BINPACK
    SPREAD = SPREAD


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """``hami.io/device-scoring-weights``: how much slots, cores and memory weigh in a card's score."""

    slot: int = 1
    core: int = 1
    memory: int = 1


_WEIGHT_KEYS: Final = ("slot", "core", "memory")


def parse_scoring_weights(value: str) -> ScoringWeights:
    """Parse ``slot=1,core=2,memory=3`` with HAMi's rules and error texts (raises ``InvalidInput``)."""

    def fail(detail: str) -> InvalidInput:
        return InvalidInput(f"invalid {DEVICE_SCORING_WEIGHTS} annotation {_go_quote(value)}: {detail}")

    parts = value.split(",")
    if len(parts) != len(_WEIGHT_KEYS):
        raise fail("expected slot, core, and memory weights")
    found: dict[str, int] = {}
    for part in parts:
        key_value = part.strip().split("=", 1)
        if len(key_value) != 2:
            raise fail("expected key=value entries")
        key = key_value[0].strip()
        if key in found:
            raise fail(f"duplicate {_go_quote(key)} weight")
        weight = _go_int(key_value[1].strip())
        if weight is None:
            raise fail(f"{_go_quote(key)} weight must be an integer")
        if weight < 0:
            raise fail(f"{_go_quote(key)} weight must not be negative")
        if key not in _WEIGHT_KEYS:
            raise fail(f"unknown weight {_go_quote(key)}")
        found[key] = weight
    if not any(found.values()):
        raise fail("at least one weight must be positive")
    return ScoringWeights(slot=found.get("slot", 0), core=found.get("core", 0), memory=found.get("memory", 0))


def _go_int(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``: an optional sign and ASCII digits, nothing else."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits.isascii() or not digits.isdigit():
        return None
    number = int(text)
    return number if -(2**63) <= number < 2**63 else None


def _go_quote(text: str) -> str:
    """Go's ``%q`` for the printable ASCII a tenant can put in an annotation."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_bool(text: str) -> bool | None:
    """Go's ``strconv.ParseBool``; ``None`` where Go returns an error."""
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    return None


def _list(value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return tuple(p.strip() for p in value.split(",") if p.strip())


# HAMi's --scheduler-name: the kube-scheduler profile the webhook routes GPU pods to, and the only pods the
# extender binds.
DEFAULT_SCHEDULER_NAME: Final = "hami-scheduler"


@dataclass(frozen=True, slots=True)
class SchedulerDefaults:
    """The scheduler's own policies (``--node-scheduler-policy``, ``--gpu-scheduler-policy``)."""

    node_policy: str = BINPACK
    gpu_policy: str = SPREAD
    memory_factor: int = 1


@dataclass(frozen=True, slots=True)
class PodPreferences:
    """What one pod asks of placement beyond its resources."""

    namespace: str = "default"
    node_policy: NodePolicy = NodePolicy.BINPACK
    gpu_policy: str = SPREAD
    weights: ScoringWeights = ScoringWeights()
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    numa_bind: bool = False
    vgpu_mode: str | None = None

    @property
    def topology(self) -> bool:
        return TOPOLOGY_AWARE in self.gpu_policy

    @property
    def mutex(self) -> bool:
        return MUTEX in self.gpu_policy


def preferences_from_annotations(
    annotations: Mapping[str, str], namespace: str, defaults: SchedulerDefaults = SchedulerDefaults()
) -> PodPreferences:
    """Read a pod's policy annotations; an invalid scoring-weights value raises ``InvalidInput``."""
    node_policy = annotations.get(NODE_SCHEDULER_POLICY) or defaults.node_policy
    weights_text = annotations.get(DEVICE_SCORING_WEIGHTS)
    return PodPreferences(
        namespace=namespace,
        node_policy=NodePolicy.SPREAD if node_policy == SPREAD else NodePolicy.BINPACK,
        gpu_policy=annotations.get(GPU_SCHEDULER_POLICY) or defaults.gpu_policy,
        weights=ScoringWeights() if weights_text is None else parse_scoring_weights(weights_text),
        use_types=_list(annotations.get(USE_GPUTYPE)),
        nouse_types=_list(annotations.get(NOUSE_GPUTYPE)),
        use_uuids=_list(annotations.get(USE_GPUUUID)),
        nouse_uuids=_list(annotations.get(NOUSE_GPUUUID)),
        numa_bind=parse_bool(annotations.get(NUMA_BIND, "")) is True,
        vgpu_mode=annotations.get(VGPU_MODE),
    )


def cordoned_devices(node_annotations: Mapping[str, str]) -> frozenset[str]:
    """The node's ``hami.io/device-cordon`` list: trimmed UUIDs skipped for new pods."""
    return frozenset(_list(node_annotations.get(DEVICE_CORDON)))
