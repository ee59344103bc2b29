"""The aggregator: holds the current :class:`ClusterState` and folds bus events into it.

The bus adapters (``on_*``) are thin: check that a node's event came on that node's subject, skip nodes of
another shard, then :func:`hami_metrics.state.apply`. Decoding, malformed messages and errors are the bus's
edge (``hami_common.bus``); an event on the wrong subject raises ``InvalidInput`` and is counted there.

Sharding: with ``shard_count`` N > 1, instance ``i`` keeps only the nodes whose name hashes (CRC-32) to
``i`` modulo N, so N aggregators split one cluster and each exposes a bounded share of the series; it
subscribes to the busy per-node subjects of those nodes only (see :meth:`Aggregator.subscribe`).
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
from hami_common.events import (
    AdmissionEvent,
    AdmissionMessage,
    AllocationResult,
    FilterRefusal,
    NodeInventory,
    PlacementDecision,
    QuotaUsage,
    UsageMessage,
)
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
        self._bus: Bus | None = None
        self._node_subscriptions: dict[str, list[Subscription]] = {}
        self._placement_adapter = self._node_adapter(subjects.placement)
        self._allocation_adapter = self._node_adapter(subjects.allocated)
        self._usage_adapter = self._node_adapter(subjects.usage)

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
    async def on_admission(self, event: AdmissionEvent | QuotaUsage, delivery: Delivery) -> None:
        if self.shard.index == 0:
            self.fold(event)

    async def on_refusal(self, event: FilterRefusal, delivery: Delivery) -> None:
        """The pending pods are shard 0's, as their admissions are."""
        if delivery.subject != subjects.scheduling(event.namespace):  # raises InvalidInput for a bad namespace
            raise InvalidInput(f"refusal of a pod in {event.namespace!r} arrived on {delivery.subject}")
        if self.shard.index == 0:
            self.fold(event)

    def _node_adapter(self, subject_of: Callable[[str], str]) -> Callable[[NodeEvent, Delivery], Awaitable[None]]:
        async def on_node_event(event: NodeEvent, delivery: Delivery) -> None:
            _check_subject(event.node, delivery, subject_of)
            if self.shard.owns(event.node):
                self.fold(event)

        return on_node_event

    async def on_inventory(self, event: NodeInventory, delivery: Delivery) -> None:
        """An inventory names a node: a shard subscribes to the busy subjects of the nodes it owns (before
        folding, so whoever waits for the inventory to be folded may publish on them at once)."""
        _check_subject(event.node, delivery, subjects.inventory)
        if not self.shard.owns(event.node):
            return
        if self.shard.count > 1 and self._bus is not None and event.node not in self._node_subscriptions:
            self._node_subscriptions[event.node] = await self._subscribe_node(self._bus, event.node)
        self.fold(event)

    def _subjects(self, node: str | None) -> list[tuple[str, type[msgspec.Struct], Handler[msgspec.Struct]]]:
        """(subject, message type, handler) of placements, allocations and usage: one node's, or every node's."""

        def subject(prefix: str, of_node: Callable[[str], str]) -> str:
            return subjects.wildcard(prefix) if node is None else of_node(node)

        usage_type = cast("type[msgspec.Struct]", UsageMessage)  # a tagged union decodes like one type
        return [
            (subject(subjects.PLACEMENT, subjects.placement), PlacementDecision, _any(self._placement_adapter)),
            (subject(subjects.ALLOCATED, subjects.allocated), AllocationResult, _any(self._allocation_adapter)),
            (subject(subjects.USAGE, subjects.usage), usage_type, _any(self._usage_adapter)),
        ]

    async def _subscribe_node(self, bus: Bus, node: str) -> list[Subscription]:
        return [await bus.subscribe(subject, kind, handler) for subject, kind, handler in self._subjects(node)]

    async def subscribe(self, bus: Bus) -> list[Subscription]:
        """Subscribe to what the aggregator reads (core NATS: the present, not the past).

        One instance (``shard_count`` 1) takes every node's subjects by wildcard. A shard takes admissions
        and inventories by wildcard (a message per node every half minute) and, from a node's first
        inventory on, only the placement, allocation and usage subjects of the nodes it owns: the server
        does the filtering, so adding shards divides the usage traffic each one decodes.
        """
        self._bus = bus
        subscriptions = [
            await bus.subscribe(
                subjects.wildcard(subjects.ADMISSION),
                cast("type[msgspec.Struct]", AdmissionMessage),  # admissions and quota snapshots
                _any_admission(self.on_admission),
            ),
            await bus.subscribe(subjects.wildcard(subjects.INVENTORY), NodeInventory, self.on_inventory),
            await bus.subscribe(subjects.wildcard(subjects.SCHEDULING), FilterRefusal, self.on_refusal),
        ]
        if self.shard.count == 1:
            for subject, kind, handler in self._subjects(None):
                subscriptions.append(await bus.subscribe(subject, kind, handler))
        return subscriptions

    async def close(self) -> None:
        """Stop the per-node subscriptions of a shard (the wildcard ones belong to the caller)."""
        self._bus = None
        for subscriptions in self._node_subscriptions.values():
            for subscription in subscriptions:
                await subscription.stop()
        self._node_subscriptions.clear()


def _any_admission(
    handler: Callable[[AdmissionEvent | QuotaUsage, Delivery], Awaitable[None]],
) -> Handler[msgspec.Struct]:
    return cast("Handler[msgspec.Struct]", handler)


def _any(handler: Callable[[NodeEvent, Delivery], Awaitable[None]]) -> Handler[msgspec.Struct]:
    """The handler as the bus sees it: the bus decodes each subject to the type it was subscribed with."""
    return cast("Handler[msgspec.Struct]", handler)


def _check_subject(node: str, delivery: Delivery, subject_of: Callable[[str], str]) -> None:
    """A node's events must come on that node's subject (NATS permissions bind subjects to publishers)."""
    if delivery.subject != subject_of(node):  # subject_of raises InvalidInput for a malformed node name
        raise InvalidInput(f"event of node {node!r} arrived on {delivery.subject}")
