"""GPU discovery through NVML (``nvidia-ml-py``), as HAMi's device plugin does it (hami-protocol §2.2, §2.3, §5.3).

* identity and size: UUID, index, name, total memory (0 when NVML cannot tell);
* NUMA node from ``/sys/bus/pci/devices/<bus id>/numa_node`` (negative becomes 0);
* health by polling: a device that stops answering (other than "not supported"), or that reported a critical
  Xid or a double-bit ECC error since start-up (Xids 13, 31, 43, 45, 68 and 109 are application faults and
  ignored), is unhealthy for good, like HAMi's device plugin, which has no recovery path;
* links: the PCIe common ancestor of every pair and the active NVLinks to each peer, read once.

Every call blocks; services use ``asyncio.to_thread``. Failing to initialise NVML raises TransientError.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from pathlib import Path
from typing import Any, Final

from hami_common.annotations.registration import MigProfile
from hami_common.errors import TransientError
from hami_common.inventory._mignvml import read_mig_profiles
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

    def __init__(self, *, pci_devices: Path = Path("/sys/bus/pci/devices"), library: Any = None) -> None:
        """``library`` is the ``pynvml`` module (imported when not given); tests pass a stand-in here."""
        self._nv = library or importlib.import_module("pynvml")
        self._pci = pci_devices
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as err:
            raise TransientError(f"NVML is not available: {err}") from err
        self._failed: set[str] = set()
        self._known: dict[int, Gpu] = {}  # the last answer per index, for a GPU that stops answering
        self._links: dict[str, tuple[GpuLink, ...]] | None = None
        self._mig: dict[str, tuple[MigProfile, ...]] = {}  # per UUID: MIG mode changes only with a GPU reset
        self._events: Any = None
        self._watch_events()

    @property
    def kind(self) -> str:
        return NVML

    # --- discovery -----------------------------------------------------------------------------------------

    def _handles_answering(self) -> list[Any]:
        handles: list[Any] = []
        for index in range(self._nv.nvmlDeviceGetCount()):
            try:
                handles.append(self._nv.nvmlDeviceGetHandleByIndex(index))
            except self._nv.NVMLError:
                continue
        return handles

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
        count = int(nv.nvmlDeviceGetCount())
        if self._links is None:
            self._links = self._read_links([nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)])
        found: list[Gpu] = []
        for index in range(count):
            try:
                gpu = self._describe(index, self._links)
            except nv.NVMLError as err:
                known = self._known.get(index)
                if known is None:
                    raise  # never seen answering: discovery itself failed
                if known.uuid not in self._failed:
                    log.warning("GPU %s stopped answering NVML, unhealthy from now on: %s", known.uuid, err)
                self._failed.add(known.uuid)
                gpu = dataclasses.replace(known, healthy=False)
            self._known[index] = gpu
            found.append(gpu)
        return tuple(found)

    def _describe(self, index: int, links: dict[str, tuple[GpuLink, ...]]) -> Gpu:
        nv = self._nv
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nv.nvmlDeviceGetUUID(handle))
        try:
            memory = int(nv.nvmlDeviceGetMemoryInfo(handle).total) // _MIB
        except nv.NVMLError as err:
            if getattr(err, "value", None) != nv.NVML_ERROR_NOT_SUPPORTED:
                raise
            memory = 0  # some boards cannot tell: registration uses preConfiguredDeviceMemory
        bus_id = self._bus_id(handle)
        if uuid not in self._mig:
            try:
                self._mig[uuid] = read_mig_profiles(nv, handle)
            except nv.NVMLError as err:
                log.warning("GPU %s: its MIG profiles cannot be read, registered without MIG: %s", uuid, err)
                self._mig[uuid] = ()
        return Gpu(
            uuid=uuid,
            index=index,
            model=_text(nv.nvmlDeviceGetName(handle)),
            memory_mib=memory,
            numa=self._numa(bus_id),
            healthy=uuid not in self._failed,
            bus_id=bus_id,
            links=links.get(uuid, ()),
            mig_profiles=self._mig[uuid],
        )

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
        for handle in self._handles_answering():
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
        for handle in self._handles_answering():
            try:
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
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
