"""A stand-in for the ``pynvml`` module: just the calls :class:`NvmlInventory` makes, over declared GPUs.

Not a driver emulator: it exists so the mapping from NVML answers to :class:`Gpu` values (bus ids, NUMA from
sysfs, NVLink counting, topology levels, Xid events, health) is tested on machines without a GPU. It is
passed to the backend's constructor, never patched in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Final

NVML_ERROR_NOT_SUPPORTED: Final = 3
NVML_ERROR_TIMEOUT: Final = 10
NVML_ERROR_GPU_IS_LOST: Final = 15


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Card:
    uuid: str
    name: str
    bus_id: str  # NVML form: 00000000:3B:00.0
    total_mib: int
    used_mib: int = 0
    util: int = 0
    nvlinks: list[str] = field(default_factory=list)  # remote bus id per active link
    lost: bool = False
    memory_unsupported: bool = False


@dataclass
class NvmlDouble:
    cards: list[Card]
    topology: dict[tuple[int, int], int] = field(default_factory=dict)  # (i, j) -> NVML_TOPOLOGY_* level
    events: deque[SimpleNamespace] = field(default_factory=deque)
    initialised: bool = False
    NVMLError: type[NVMLError] = NVMLError
    NVML_NVLINK_MAX_LINKS: int = 18
    NVML_FEATURE_ENABLED: int = 1
    NVML_ERROR_NOT_SUPPORTED: int = NVML_ERROR_NOT_SUPPORTED
    nvmlEventTypeXidCriticalError: int = 0x8  # noqa: N815
    nvmlEventTypeDoubleBitEccError: int = 0x2  # noqa: N815

    def nvmlInit(self) -> None:  # noqa: N802
        self.initialised = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def _card(self, handle: int) -> Card:
        card = self.cards[handle]
        if card.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return card

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:  # noqa: N802
        return self.cards[handle].uuid.encode()

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return self.cards[handle].name

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=self.cards[handle].bus_id.encode())

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        card = self._card(handle)
        if card.memory_unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(total=card.total_mib << 20, used=card.used_mib << 20)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=self._card(handle).util, memory=self._card(handle).util // 2)

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:  # noqa: N802
        if not self.cards[handle].nvlinks or link >= len(self.cards[handle].nvlinks):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=self.cards[handle].nvlinks[link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:  # noqa: N802
        if (a, b) not in self.topology:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return self.topology[(a, b)]

    def nvmlEventSetCreate(self) -> str:  # noqa: N802
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, mask: int, event_set: str) -> None:  # noqa: N802
        """Every card accepts the registration."""

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:  # noqa: N802
        if not self.events:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        return self.events.popleft()

    def nvmlEventSetFree(self, event_set: str) -> None:  # noqa: N802
        """Nothing to free."""

    def xid(self, handle: int, xid: int) -> None:
        """Queue a critical-Xid event for ``handle``, as the driver would."""
        self.events.append(SimpleNamespace(device=handle, eventType=self.nvmlEventTypeXidCriticalError, eventData=xid))
