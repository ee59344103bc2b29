"""GPU discovery through NVML (``nvidia-ml-py``), as HAMi's device plugin does it (hami-protocol §2.2, §2.3, §5.3).

* identity and size: UUID, index, name, total memory (0 when NVML cannot tell);
* NUMA node from ``/sys/bus/pci/devices/<bus id>/numa_node`` (negative becomes 0);
* health by polling: a device that stops answering, or that reported a critical Xid or a double-bit ECC
  error since start-up (Xids 13, 31, 43, 45, 68 and 109 are application faults and ignored), is unhealthy
  for good, like HAMi's device plugin, which has no recovery path;
* links: the PCIe common ancestor of every pair and the active NVLinks to each peer, read once.

Every call blocks; services use ``asyncio.to_thread``. Failing to initialise NVML raises TransientError.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from types import ModuleType
from typing import Any, Final

from hami_common.errors import TransientError
from hami_common.inventory._model import Gpu, GpuLink, GpuStats, PcieLevel

__all__ = ["IGNORED_XIDS", "NVML", "NvmlInventory", "sysfs_bus_id"]

log = logging.getLogger(__name__)

NVML: Final = "nvml"
IGNORED_XIDS: Final = frozenset({13, 31, 43, 45, 68, 109})
_MIB: Final = 1024 * 1024
_LEVELS: Final = {  # NVML_TOPOLOGY_* values
    0: PcieLevel.SAME_BOARD,
    10: PcieLevel.SINGLE_SWITCH,
    20: PcieLevel.MULTI_SWITCH,
    30: PcieLevel.HOST_BRIDGE,
    40: PcieLevel.SAME_CPU,
    50: PcieLevel.CROSS_CPU,
}


def _text(value: Any) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """``00000000:3B:00.0`` (NVML, 8-digit domain) -> ``0000:3b:00.0`` (sysfs)."""
    domain, _, rest = nvml_bus_id.strip().lower().partition(":")
    return f"{domain[-4:]}:{rest}" if rest else domain


class NvmlInventory:
    """:class:`~hami_common.inventory.GpuInventory` over the driver's NVML library."""

    def __init__(self, *, pci_devices: Path = Path("/sys/bus/pci/devices"), library: ModuleType | None = None) -> None:
        self._nv = library or importlib.import_module("pynvml")
        self._pci = pci_devices
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as err:
            raise TransientError(f"NVML is not available: {err}") from err
        self._failed: set[str] = set()
        self._links: dict[str, tuple[GpuLink, ...]] | None = None
        self._events: Any = None
        self._watch_events()

    @property
    def kind(self) -> str:
        return NVML

    # --- discovery -----------------------------------------------------------------------------------------

    def _handles(self) -> list[Any]:
        return [self._nv.nvmlDeviceGetHandleByIndex(i) for i in range(self._nv.nvmlDeviceGetCount())]

    def _numa(self, bus_id: str) -> int:
        try:
            return max(int((self._pci / sysfs_bus_id(bus_id) / "numa_node").read_text().strip()), 0)
        except (OSError, ValueError):
            return 0

    def _bus_id(self, handle: Any) -> str:
        return _text(self._nv.nvmlDeviceGetPciInfo(handle).busId)

    def gpus(self) -> tuple[Gpu, ...]:
        try:
            return self._gpus()
        except self._nv.NVMLError as err:
            raise TransientError(f"NVML discovery failed: {err}") from err

    def _gpus(self) -> tuple[Gpu, ...]:
        nv = self._nv
        self._drain_events()
        handles = self._handles()
        if self._links is None:
            self._links = self._read_links(handles)
        found: list[Gpu] = []
        for index, handle in enumerate(handles):
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
            healthy = uuid not in self._failed
            try:
                memory = int(nv.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
            except nv.NVMLError as err:
                log.warning("GPU %s does not report its memory: %s", uuid, err)
                memory, healthy = 0, False
            bus_id = self._bus_id(handle)
            found.append(
                Gpu(
                    uuid=uuid,
                    index=index,
                    model=_text(nv.nvmlDeviceGetName(handle)),
                    memory_mib=memory,
                    numa=self._numa(bus_id),
                    healthy=healthy,
                    bus_id=bus_id,
                    links=self._links.get(uuid, ()),
                )
            )
        return tuple(found)

    def _read_links(self, handles: list[Any]) -> dict[str, tuple[GpuLink, ...]]:
        nv = self._nv
        uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
        by_bus = {sysfs_bus_id(self._bus_id(h)): u for h, u in zip(handles, uuids, strict=True)}
        links: dict[str, tuple[GpuLink, ...]] = {}
        for handle, uuid in zip(handles, uuids, strict=True):
            nvlinks: dict[str, int] = {}
            for link in range(nv.NVML_NVLINK_MAX_LINKS):
                try:
                    if nv.nvmlDeviceGetNvLinkState(handle, link) != nv.NVML_FEATURE_ENABLED:
                        continue
                    remote = sysfs_bus_id(_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId))
                except nv.NVMLError:
                    break  # no (more) NVLinks on this device
                if remote in by_bus:
                    nvlinks[by_bus[remote]] = nvlinks.get(by_bus[remote], 0) + 1
            mine: list[GpuLink] = []
            for other, peer in zip(handles, uuids, strict=True):
                if peer == uuid:
                    continue
                try:
                    level = _LEVELS.get(int(nv.nvmlDeviceGetTopologyCommonAncestor(handle, other)))
                except nv.NVMLError:
                    level = None
                mine.append(GpuLink(peer=peer, pcie=level, nvlinks=nvlinks.get(peer, 0)))
            links[uuid] = tuple(mine)
        return links

    # --- health --------------------------------------------------------------------------------------------

    def _watch_events(self) -> None:
        nv = self._nv
        try:
            self._events = nv.nvmlEventSetCreate()
        except nv.NVMLError as err:
            log.warning("NVML events unavailable, health is polled without Xid events: %s", err)
            return
        mask = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        for handle in self._handles():
            try:
                nv.nvmlDeviceRegisterEvents(handle, mask, self._events)
            except nv.NVMLError as err:
                log.warning("GPU %s: no health events (%s)", _text(nv.nvmlDeviceGetUUID(handle)), err)

    def _drain_events(self) -> None:
        nv = self._nv
        if self._events is None:
            return
        while True:
            try:
                event = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:
                return  # timeout: nothing pending
            xid = int(event.eventData)
            if event.eventType == nv.nvmlEventTypeXidCriticalError and xid in IGNORED_XIDS:
                continue
            uuid = _text(nv.nvmlDeviceGetUUID(event.device))
            if uuid not in self._failed:
                log.warning("GPU %s is unhealthy from now on: NVML event %#x, Xid %d", uuid, event.eventType, xid)
            self._failed.add(uuid)

    # --- host figures --------------------------------------------------------------------------------------

    def stats(self) -> tuple[GpuStats, ...]:
        try:
            return self._stats()
        except self._nv.NVMLError as err:
            raise TransientError(f"NVML figures failed: {err}") from err

    def _stats(self) -> tuple[GpuStats, ...]:
        nv = self._nv
        figures: list[GpuStats] = []
        for handle in self._handles():
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
            try:
                used = int(nv.nvmlDeviceGetMemoryInfo(handle).used)
                rates = nv.nvmlDeviceGetUtilizationRates(handle)
            except nv.NVMLError:
                continue
            figures.append(GpuStats(uuid, used, int(rates.gpu), int(rates.memory)))
        return tuple(figures)

    def close(self) -> None:
        nv = self._nv
        if self._events is not None:
            try:
                nv.nvmlEventSetFree(self._events)
            except nv.NVMLError as err:
                log.debug("freeing the NVML event set failed: %s", err)
            self._events = None
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as err:
            log.debug("NVML shutdown failed: %s", err)
