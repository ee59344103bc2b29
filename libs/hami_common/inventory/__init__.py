"""The GPUs of a node: values, the :class:`GpuInventory` port and its two backends, chosen by name.

* :class:`NvmlInventory` (``"nvml"``) asks the driver through ``nvidia-ml-py``;
* :class:`FakeInventory` (``"fake"``) reads a declared YAML file, for CPU-only machines and the simulator.

:func:`open_inventory` picks one by the configured word and never falls back to the other: a node agent
configured for NVML on a machine without a driver fails to start instead of registering fake GPUs.
"""

from __future__ import annotations

from pathlib import Path

from hami_common.errors import InvalidInput
from hami_common.inventory._fake import FAKE, FakeInventory, decode_fake_inventory
from hami_common.inventory._model import (
    NVLINK_SCORE,
    Gpu,
    GpuInventory,
    GpuLink,
    GpuStats,
    PairScoreReport,
    PcieLevel,
    pair_scores,
)
from hami_common.inventory._nodeconfig import MODE_HAMI_CORE, NodeDeviceConfig, apply_node_overrides
from hami_common.inventory._nvml import IGNORED_XIDS, NVML, NvmlInventory, sysfs_bus_id

__all__ = [
    "FAKE",
    "IGNORED_XIDS",
    "KINDS",
    "MODE_HAMI_CORE",
    "NVLINK_SCORE",
    "NVML",
    "FakeInventory",
    "Gpu",
    "GpuInventory",
    "GpuLink",
    "GpuStats",
    "NodeDeviceConfig",
    "NvmlInventory",
    "PairScoreReport",
    "PcieLevel",
    "apply_node_overrides",
    "decode_fake_inventory",
    "open_inventory",
    "pair_scores",
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
