"""The device plugin's registration knobs (hami-protocol §1.2) and HAMi's per-node overrides (§1.3).

HAMi reads ``/config/config.json``: ``{"nodeconfig": [{"name": <node>, "devicesplitcount": …}, …]}``; the
entry whose ``name`` is this node overrides the chart-wide values. Only the keys that shape what a node
registers are applied here; the rest are accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

import msgspec

from hami_common.errors import InvalidInput

__all__ = ["MODE_HAMI_CORE", "NodeDeviceConfig", "apply_node_overrides"]

MODE_HAMI_CORE: Final = "hami-core"


@dataclass(frozen=True, slots=True)
class NodeDeviceConfig:
    split_count: int = 10  # deviceSplitCount
    memory_scaling: float = 1.0  # deviceMemoryScaling
    core_scaling: float = 1.0  # deviceCoreScaling
    preconfigured_memory_mib: int = 0  # preConfiguredDeviceMemory: MiB when NVML cannot tell
    mode: str = MODE_HAMI_CORE  # operatingmode; this project implements hami-core only
    filter_uuids: frozenset[str] = frozenset()  # filterdevices.uuid: never registered
    filter_indices: frozenset[int] = frozenset()  # filterdevices.index

    def __post_init__(self) -> None:
        if self.split_count < 1 or self.memory_scaling <= 0 or self.core_scaling <= 0:
            raise InvalidInput(
                f"device config: split count {self.split_count}, memory scaling {self.memory_scaling} and core "
                f"scaling {self.core_scaling} must be positive"
            )
        if self.preconfigured_memory_mib < 0:
            raise InvalidInput(f"device config: preconfigured memory {self.preconfigured_memory_mib} is negative")


class _Filter(msgspec.Struct, frozen=True):
    uuid: tuple[str, ...] = ()
    index: tuple[int, ...] = ()


class _NodeEntry(msgspec.Struct, frozen=True):
    name: str = ""
    operatingmode: str | None = None
    devicesplitcount: int | None = None
    devicememoryscaling: float | None = None
    devicecorescaling: float | None = None
    preconfigureddevicememory: int | None = None
    filterdevices: _Filter | None = None


class _ConfigFile(msgspec.Struct, frozen=True):
    nodeconfig: tuple[_NodeEntry, ...] = ()


def apply_node_overrides(base: NodeDeviceConfig, config_json: bytes | str, node: str) -> NodeDeviceConfig:
    """``base`` with the overrides of ``node``'s entry in HAMi's config.json (unchanged if it has none)."""
    try:
        entries = msgspec.json.decode(config_json, type=_ConfigFile).nodeconfig
    except msgspec.DecodeError as err:
        raise InvalidInput(f"node config: {err}") from err
    entry = next((e for e in entries if e.name == node), None)
    if entry is None:
        return base
    changes: dict[str, object] = {}
    for field, value in (
        ("mode", entry.operatingmode),
        ("split_count", entry.devicesplitcount),
        ("memory_scaling", entry.devicememoryscaling),
        ("core_scaling", entry.devicecorescaling),
        ("preconfigured_memory_mib", entry.preconfigureddevicememory),
    ):
        if value is not None and value != "":
            changes[field] = value
    if entry.filterdevices is not None:
        changes["filter_uuids"] = frozenset(entry.filterdevices.uuid)
        changes["filter_indices"] = frozenset(entry.filterdevices.index)
    if changes.get("mode", MODE_HAMI_CORE) != MODE_HAMI_CORE:
        raise InvalidInput(f"node config: operating mode {changes['mode']!r} of {node} is not supported (hami-core)")
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
