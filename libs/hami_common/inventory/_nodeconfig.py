"""What one node's services apply (hami-protocol §1.2) and HAMi's per-node overrides (§1.3).

HAMi reads ``/config/config.json``: ``{"nodeconfig": [{"name": <node>, "devicesplitcount": …}, …]}``; the
entry whose ``name`` is this node overrides the chart-wide values. The node agent (registration) and the
allocator (what the kubelet is told) apply the same :class:`NodeDeviceConfig`, so the slots a node registers
and the devices the kubelet counts cannot disagree. Every key of an entry either takes effect or is refused
with the reason: a key this project cannot honour must not be accepted silently.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import msgspec

from hami_common.annotations.registration import MODE_HAMI_CORE, MODE_MIG, MigProfile
from hami_common.errors import InvalidInput
from hami_common.inventory._migprofiles import MigAllowlist, allowed_mig_profiles
from hami_common.inventory._model import Gpu

__all__ = [
    "LIBCUDA_LOG_LEVELS",
    "MIG_STRATEGIES",
    "MIG_STRATEGY_MIXED",
    "MIG_STRATEGY_NONE",
    "MIG_STRATEGY_SINGLE",
    "MODES",
    "MODE_HAMI_CORE",
    "MODE_MIG",
    "NodeDeviceConfig",
    "NodeEntry",
    "apply_node_entry",
    "apply_node_overrides",
    "decode_node_entries",
    "find_node_entry",
]

MODES: Final = (MODE_HAMI_CORE, MODE_MIG)  # operatingmode (HAMi: pkg/device/nvidia/device.go:117-147)
MIG_STRATEGY_NONE: Final = "none"
MIG_STRATEGY_SINGLE: Final = "single"
MIG_STRATEGY_MIXED: Final = "mixed"
MIG_STRATEGIES: Final = (MIG_STRATEGY_NONE, MIG_STRATEGY_SINGLE, MIG_STRATEGY_MIXED)
# HAMi-core reads 0..4 (hami-protocol §1.2; vgpu-interposer.md): anything else is a typo, not a level
LIBCUDA_LOG_LEVELS: Final = frozenset({"0", "1", "2", "3", "4"})


@dataclass(frozen=True, slots=True)
class NodeDeviceConfig:
    split_count: int = 10  # deviceSplitCount
    memory_scaling: float = 1.0  # deviceMemoryScaling
    core_scaling: float = 1.0  # deviceCoreScaling
    preconfigured_memory_mib: int = 0  # preConfiguredDeviceMemory: MiB when NVML cannot tell
    mode: str = MODE_HAMI_CORE  # operatingmode: hami-core, or mig (GPUs in MIG mode are cut into instances)
    filter_uuids: frozenset[str] = frozenset()  # filterdevices.uuid: never registered nor advertised
    filter_indices: frozenset[int] = frozenset()  # filterdevices.index
    libcuda_log_level: str = ""  # libCudaLogLevel: LIBCUDA_LOG_LEVEL in every container ("" leaves it unset)
    numa_topology: bool = False  # enableNumaTopology: the kubelet sees each device's NUMA node
    mig_strategy: str = MIG_STRATEGY_NONE  # migstrategy: none, single or mixed
    preferred_allocation: bool = True  # enablegetpreferredallocation: offer GetPreferredAllocation
    # migProfileAllowlist (chart-wide): here so node agent and allocator filter profiles through one function
    mig_allowlist: tuple[MigAllowlist, ...] = ()

    def __post_init__(self) -> None:
        # not (x > 0) refuses NaN too; an infinite scaling would register unbounded memory or cores
        scalings = (self.memory_scaling, self.core_scaling)
        if self.split_count < 1 or not all(x > 0 and math.isfinite(x) for x in scalings):
            raise InvalidInput(
                f"device config: split count {self.split_count}, memory scaling {self.memory_scaling} and core "
                f"scaling {self.core_scaling} must be positive (and finite)"
            )
        if self.preconfigured_memory_mib < 0:
            raise InvalidInput(f"device config: preconfigured memory {self.preconfigured_memory_mib} is negative")
        if self.mode not in MODES:
            raise InvalidInput(f"device config: operating mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.mig_strategy not in ("", *MIG_STRATEGIES):
            raise InvalidInput(
                f"device config: migstrategy {self.mig_strategy!r} is not one of {', '.join(MIG_STRATEGIES)}"
            )
        if self.libcuda_log_level and self.libcuda_log_level not in LIBCUDA_LOG_LEVELS:
            raise InvalidInput(f"device config: libcuda log level {self.libcuda_log_level!r} is not one of 0..4")

    def mig_profiles(self, gpu: Gpu) -> tuple[MigProfile, ...]:
        """The MIG profiles ``gpu`` offers on this node: none unless the node runs in MIG mode and the GPU is in
        MIG mode, then those ``migProfileAllowlist`` allows for its model. The node agent registers them and the
        allocator creates instances of them only: both call this."""
        if self.mode != MODE_MIG or not gpu.mig:
            return ()
        return allowed_mig_profiles(self.mig_allowlist, gpu.model, gpu.mig_profiles)

    def registers(self, uuid: str, index: int | None) -> bool:
        """False for a GPU ``filterdevices`` excludes: neither registered nor advertised to the kubelet."""
        return uuid not in self.filter_uuids and (index is None or index not in self.filter_indices)


class _Filter(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    uuid: tuple[str, ...] = ()
    index: tuple[int, ...] = ()


class NodeEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One ``nodeconfig`` entry with HAMi's JSON keys; ``None`` keeps the chart-wide value."""

    name: str = ""
    operatingmode: str | None = None
    devicesplitcount: int | None = None
    devicememoryscaling: float | None = None
    devicecorescaling: float | None = None
    preconfigureddevicememory: int | None = None
    libcudaloglevel: int | str | None = None
    enablenumatopology: bool | None = None
    migstrategy: str | None = None
    filterdevices: _Filter | None = None
    enablegetpreferredallocation: bool | None = None


class _ConfigFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    nodeconfig: tuple[NodeEntry, ...] = ()


def decode_node_entries(config_json: bytes | str) -> tuple[NodeEntry, ...]:
    """The entries of HAMi's config.json; an unknown key or a wrong type is named in the error."""
    try:
        return msgspec.json.decode(config_json, type=_ConfigFile).nodeconfig
    except msgspec.DecodeError as err:  # ValidationError is a DecodeError: "... - at `$.nodeconfig[0]`"
        raise InvalidInput(f"node config: {err}") from err


def apply_node_entry(base: NodeDeviceConfig, entry: NodeEntry) -> NodeDeviceConfig:
    """``base`` with every key ``entry`` sets; refused (InvalidInput naming the node) if it cannot apply."""
    changes: dict[str, object] = {}
    level = entry.libcudaloglevel
    for field, value in (
        ("mode", entry.operatingmode),
        ("split_count", entry.devicesplitcount),
        ("memory_scaling", entry.devicememoryscaling),
        ("core_scaling", entry.devicecorescaling),
        ("preconfigured_memory_mib", entry.preconfigureddevicememory),
        ("libcuda_log_level", None if level is None else str(level)),
        ("numa_topology", entry.enablenumatopology),
        ("mig_strategy", entry.migstrategy),
        ("preferred_allocation", entry.enablegetpreferredallocation),
    ):
        if value is not None and value != "":
            changes[field] = value
    if entry.filterdevices is not None:
        changes["filter_uuids"] = frozenset(entry.filterdevices.uuid)
        changes["filter_indices"] = frozenset(entry.filterdevices.index)
    try:
        return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
    except InvalidInput as err:
        raise InvalidInput(f"nodeconfig entry {entry.name!r}: {err}") from err


def find_node_entry(entries: Iterable[NodeEntry], node: str) -> NodeEntry | None:
    """The entry HAMi applies: the first whose name is ``node``."""
    return next((e for e in entries if e.name == node), None)


def apply_node_overrides(base: NodeDeviceConfig, config_json: bytes | str, node: str) -> NodeDeviceConfig:
    """``base`` with the overrides of ``node``'s entry in HAMi's config.json (unchanged if it has none)."""
    entry = find_node_entry(decode_node_entries(config_json), node)
    return base if entry is None else apply_node_entry(base, entry)
