"""The aggregator: holds the current :class:`ClusterState` and folds bus events into it.

The bus adapters (``on_*``) are thin: check that a node's event came on that node's subject, skip nodes of
another shard, then :func:`hami_metrics.state.apply`. Decoding, malformed messages and errors are the bus's
edge (``hami_common.bus``); an event on the wrong subject raises ``InvalidInput`` and is counted there.

Sharding: with ``shard_count`` N > 1, instance ``i`` keeps only the nodes whose name hashes (CRC-32) to
``i`` modulo N, so N aggregators split one cluster and each exposes a bounded share of the series.
Admission events are cluster-wide and only shard 0 counts them.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar, cast

import msgspec

from hami_common import subjects
from hami_common.bus import Bus, Delivery, Handler, Subscription
from hami_common.errors import InvalidInput
from hami_common.events import AdmissionEvent, AllocationResult, NodeInventory, PlacementDecision
from hami_metrics.messages import UsageMessage
from hami_metrics.staleness import Retention, expire
from hami_metrics.state import ClusterState, Event, apply

__all__ = ["Aggregator", "Clock", "Shard", "SystemClock"]

NodeEvent = TypeVar("NodeEvent", PlacementDecision, AllocationResult, NodeInventory, UsageMessage)


class Clock(Protocol):
    def now_ns(self) -> int: ...


class SystemClock:
    def now_ns(self) -> int:
        return time.time_ns()


@dataclass(frozen=True, slots=True)
class Shard:
    index: int = 0
    count: int = 1

    def owns(self, node: str) -> bool:
        return self.count == 1 or zlib.crc32(node.encode()) % self.count == self.index


class Aggregator:
    """The one mutable holder of state in the service; every change goes through :meth:`fold`."""

    def __init__(self, retention: Retention, clock: Clock | None = None, shard: Shard | None = None) -> None:
        self.retention = retention
        self.clock: Clock = clock or SystemClock()
        self.shard = shard or Shard()
        self._state = ClusterState()
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    @property
    def state(self) -> ClusterState:
        return self._state

    def fold(self, event: Event) -> None:
        self._state = apply(self._state, event, self.clock.now_ns())
        if self._waiters:
            self._wake()

    def snapshot(self) -> ClusterState:
        """The state as a scrape should show it: with everything past its staleness dropped."""
        self._state = expire(self._state, self.clock.now_ns(), self.retention)
        return self._state

    async def wait_applied(self, count: int) -> None:
        """Return once ``count`` events in all have been folded in (for tests and start-up checks)."""
        if self._state.applied >= count:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((count, future))
        await future

    def _wake(self) -> None:
        applied = self._state.applied
        still: list[tuple[int, asyncio.Future[None]]] = []
        for target, future in self._waiters:
            if future.done():
                continue
            if target <= applied:
                future.set_result(None)
            else:
                still.append((target, future))
        self._waiters = still

    # --- bus adapters --------------------------------------------------------------------------------
    async def on_admission(self, event: AdmissionEvent, delivery: Delivery) -> None:
        if self.shard.index == 0:
            self.fold(event)

    def _node_adapter(self, subject_of: Callable[[str], str]) -> Callable[[NodeEvent, Delivery], Awaitable[None]]:
        async def on_node_event(event: NodeEvent, delivery: Delivery) -> None:
            if delivery.subject != subject_of(event.node):  # raises InvalidInput for a malformed node name
                raise InvalidInput(f"event of node {event.node!r} arrived on {delivery.subject}")
            if self.shard.owns(event.node):
                self.fold(event)

        return on_node_event

    async def subscribe(self, bus: Bus) -> list[Subscription]:
        """Subscribe to every subject the aggregator reads (core NATS: the present, not the past)."""
        usage_type = cast("type[msgspec.Struct]", UsageMessage)  # a tagged union decodes like one type
        usage_handler = cast("Handler[msgspec.Struct]", self._node_adapter(subjects.usage))
        return [
            await bus.subscribe(subjects.wildcard(subjects.ADMISSION), AdmissionEvent, self.on_admission),
            await bus.subscribe(
                subjects.wildcard(subjects.PLACEMENT), PlacementDecision, self._node_adapter(subjects.placement)
            ),
            await bus.subscribe(
                subjects.wildcard(subjects.ALLOCATED), AllocationResult, self._node_adapter(subjects.allocated)
            ),
            await bus.subscribe(
                subjects.wildcard(subjects.INVENTORY), NodeInventory, self._node_adapter(subjects.inventory)
            ),
            await bus.subscribe(subjects.wildcard(subjects.USAGE), usage_type, usage_handler),
        ]
