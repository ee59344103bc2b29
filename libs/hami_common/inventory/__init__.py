"""The GPUs of a node: values, the :class:`GpuInventory` port and its two backends, chosen by name.

* :class:`NvmlInventory` (``"nvml"``) asks the driver through ``nvidia-ml-py``;
* :class:`FakeInventory` (``"fake"``) reads a declared YAML file, for CPU-only machines and the simulator.

:func:`open_inventory` picks one by the configured word and never falls back to the other: a node agent
configured for NVML on a machine without a driver fails to start instead of registering fake GPUs.
:func:`open_mig_control` does the same for the MIG side of the node's GPUs (:class:`MigControl`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hami_common.errors import InvalidInput
from hami_common.inventory._fake import FAKE, FakeInventory, decode_fake_inventory
from hami_common.inventory._mig import MigControl, MigInstance, MigNotPermitted, MigRefused
from hami_common.inventory._migfake import FakeMigControl, default_state_file, discard_state
from hami_common.inventory._mignvml import NvmlMigControl
from hami_common.inventory._migprofiles import (
    MIG_CARDS,
    MigAllowlist,
    MigCard,
    allowed_mig_profiles,
    instance_count,
    mig_card,
    model_matches,
    profile_core,
    profile_name,
)
from hami_common.inventory._model import (
    NVIDIA_VENDOR,
    NVLINK_SCORE,
    Gpu,
    GpuInventory,
    GpuLink,
    GpuStats,
    PairScoreReport,
    PcieLevel,
    pair_scores,
)
from hami_common.inventory._nodeconfig import (
    MIG_STRATEGIES,
    MODE_HAMI_CORE,
    MODE_MIG,
    NodeDeviceConfig,
    apply_node_overrides,
)
from hami_common.inventory._nvml import IGNORED_XIDS, NVML, NvmlInventory, sysfs_bus_id

__all__ = [
    "FAKE",
    "IGNORED_XIDS",
    "KINDS",
    "MIG_CARDS",
    "MIG_STRATEGIES",
    "MODE_HAMI_CORE",
    "MODE_MIG",
    "NVIDIA_VENDOR",
    "NVLINK_SCORE",
    "NVML",
    "FakeInventory",
    "FakeMigControl",
    "Gpu",
    "GpuInventory",
    "GpuLink",
    "GpuStats",
    "MigAllowlist",
    "MigCard",
    "MigControl",
    "MigInstance",
    "MigNotPermitted",
    "MigRefused",
    "NodeDeviceConfig",
    "NvmlInventory",
    "NvmlMigControl",
    "PairScoreReport",
    "PcieLevel",
    "allowed_mig_profiles",
    "apply_node_overrides",
    "decode_fake_inventory",
    "default_state_file",
    "discard_state",
    "instance_count",
    "mig_card",
    "model_matches",
    "open_inventory",
    "open_mig_control",
    "pair_scores",
    "profile_core",
    "profile_name",
    "sysfs_bus_id",
]

KINDS = (NVML, FAKE)


def open_inventory(kind: str, *, node: str, fake_file: Path | str = "") -> GpuInventory:
    """The backend named ``kind``; InvalidInput for an unknown word or a fake inventory without a file,
    TransientError when NVML cannot be initialised. Blocking (NVML init): call it through ``to_thread``."""
    if kind == NVML:
        return NvmlInventory()
    if kind == FAKE:
        if not fake_file:
            raise InvalidInput("the fake inventory needs a file (--fake-inventory)")
        return FakeInventory(fake_file, node)
    raise InvalidInput(f"unknown inventory kind {kind!r}; choose one of {', '.join(KINDS)}")


def open_mig_control(
    kind: str, *, node: str, fake_file: Path | str = "", state_file: Path | str = "", library: Any = None
) -> MigControl:
    """The MIG backend for the inventory named ``kind``, on the same terms as :func:`open_inventory`.

    For the fake inventory the instances live in ``state_file``, shared by every process of the node that opens
    it with the same arguments (by default :func:`default_state_file` of the inventory file and node, so the node
    agent and the allocator agree without being told). ``library`` replaces ``pynvml`` for NVML (tests).
    Blocking (NVML init, file reads): call it through ``to_thread``.
    """
    if kind == NVML:
        return NvmlMigControl(library=library)
    if kind == FAKE:
        if not fake_file:
            raise InvalidInput("the fake inventory needs a file (--fake-inventory)")
        return FakeMigControl(FakeInventory(fake_file, node), state_file or default_state_file(fake_file, node))
    raise InvalidInput(f"unknown inventory kind {kind!r}; choose one of {', '.join(KINDS)}")
