"""Where the plugin's GPUs come from, and the virtual devices it advertises for them (hami-protocol §5.2).

:class:`GpuSource` is the port: the node agent's discovery (NVML or a declared fake inventory) satisfies it;
:class:`DeclaredInventory` is a fixed list whose health a caller (or a test) can flip;
:class:`DiscoveredInventory` adapts the node agent's discovery (``hami_common.inventory``: NVML or fake).
Each physical GPU becomes ``deviceSplitCount`` virtual devices ``<UUID>-<i>`` (stable, at most 63
characters: a longer UUID is shortened with a hash of itself, so the same GPU always gets the same IDs).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from hami_common.errors import HamiError
from hami_common.inventory import Gpu as DiscoveredGpu
from hami_common.inventory import GpuInventory

__all__ = [
    "MAX_DEVICE_ID",
    "DeclaredInventory",
    "DiscoveredInventory",
    "Gpu",
    "GpuSource",
    "InventorySnapshot",
    "VirtualDevice",
    "device_id",
    "parse_declared",
    "virtual_devices",
]

log = logging.getLogger(__name__)

MAX_DEVICE_ID: Final = 63
_HASH_CHARS: Final = 10


@dataclass(frozen=True, slots=True)
class Gpu:
    uuid: str
    healthy: bool = True
    numa: int | None = None


@dataclass(frozen=True, slots=True)
class InventorySnapshot:
    version: int  # grows with every change; ListAndWatch re-sends the list when it moves
    gpus: tuple[Gpu, ...]


class GpuSource(Protocol):
    def snapshot(self) -> InventorySnapshot: ...

    async def wait_newer(self, version: int) -> InventorySnapshot:
        """Return as soon as the inventory's version is past ``version``."""
        ...


@dataclass(frozen=True, slots=True)
class VirtualDevice:
    id: str
    uuid: str
    healthy: bool
    numa: int | None


def device_id(uuid: str, index: int) -> str:
    """``<UUID>-<index>``, or a stable shortened form when that would pass 63 characters."""
    full = f"{uuid}-{index}"
    if len(full) <= MAX_DEVICE_ID:
        return full
    digest = hashlib.sha256(uuid.encode()).hexdigest()[:_HASH_CHARS]
    suffix = f"-{digest}-{index}"
    return uuid[: MAX_DEVICE_ID - len(suffix)] + suffix


def virtual_devices(gpus: Iterable[Gpu], split: int) -> tuple[VirtualDevice, ...]:
    return tuple(
        VirtualDevice(id=device_id(gpu.uuid, i), uuid=gpu.uuid, healthy=gpu.healthy, numa=gpu.numa)
        for gpu in gpus
        for i in range(split)
    )


def parse_declared(entries: Iterable[str]) -> tuple[Gpu, ...]:
    """``GPU-uuid`` or ``GPU-uuid:<numa>`` entries, as the ``--gpus`` setting lists them."""
    gpus = []
    for entry in entries:
        uuid, _, numa = entry.strip().partition(":")
        if not uuid:
            raise ValueError(f"empty GPU UUID in {entry!r}")
        gpus.append(Gpu(uuid=uuid, numa=int(numa) if numa else None))
    if len({g.uuid for g in gpus}) != len(gpus):
        raise ValueError("a GPU UUID is declared twice")
    return tuple(gpus)


class DeclaredInventory:
    """A fixed list of GPUs; :meth:`set_health` changes one and wakes every watcher."""

    def __init__(self, gpus: Iterable[Gpu]) -> None:
        self._snapshot = InventorySnapshot(version=1, gpus=tuple(gpus))
        self._changed = asyncio.Condition()

    def snapshot(self) -> InventorySnapshot:
        return self._snapshot

    async def wait_newer(self, version: int) -> InventorySnapshot:
        async with self._changed:
            await self._changed.wait_for(lambda: self._snapshot.version > version)
            return self._snapshot

    async def update(self, health: Mapping[str, bool]) -> None:
        await self.replace(
            Gpu(uuid=g.uuid, healthy=health.get(g.uuid, g.healthy), numa=g.numa) for g in self._snapshot.gpus
        )

    async def replace(self, gpus: Iterable[Gpu]) -> None:
        """Publish a new list; watchers wake only if it differs from the current one."""
        fresh = tuple(gpus)
        if fresh == self._snapshot.gpus:
            return
        async with self._changed:
            self._snapshot = InventorySnapshot(version=self._snapshot.version + 1, gpus=fresh)
            self._changed.notify_all()

    async def set_health(self, uuid: str, healthy: bool) -> None:
        await self.update({uuid: healthy})


class DiscoveredInventory(DeclaredInventory):
    """The node agent's discovery (:class:`hami_common.inventory.GpuInventory`: NVML or the declared fake
    file) as a :class:`GpuSource`: read in a worker thread (NVML blocks) by :meth:`refresh`, and again every
    ``poll_interval`` seconds by :meth:`run`, so a GPU that turns unhealthy is re-advertised within a poll."""

    def __init__(
        self,
        backend: GpuInventory,
        poll_interval: float = 5.0,
        visible: Callable[[str, int | None], bool] = lambda uuid, index: True,
    ) -> None:
        super().__init__(())
        self.backend = backend
        self.poll_interval = poll_interval
        self.visible = visible  # filterdevices: (uuid, index) -> advertised; the node agent skips the same GPUs

    def _convert(self, found: Iterable[DiscoveredGpu]) -> tuple[Gpu, ...]:
        return tuple(
            Gpu(uuid=g.uuid, healthy=g.healthy, numa=g.numa)
            for g in found
            if g.is_nvidia and self.visible(g.uuid, g.index)  # other vendors' devices have their own plugins
        )

    async def refresh(self) -> None:
        await self.replace(self._convert(await asyncio.to_thread(self.backend.gpus)))

    async def run(self) -> None:
        """Poll until cancelled; a failed read is logged and the last list stays advertised."""
        while True:
            await asyncio.sleep(self.poll_interval)  # discovery has no change notification to wait on
            try:
                await self.refresh()
            except HamiError as err:
                log.warning("GPU discovery failed, keeping the last list: %s", err)
