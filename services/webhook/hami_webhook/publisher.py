"""Best-effort AdmissionEvents (and quota snapshots): the request path only enqueues; one task owned by
the app publishes.

Admission never waits for NATS and never fails because of it: events queue up to a bound while the bus
is slow or down, the rest are dropped and counted, and each publish has a short timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol

import msgspec
import nats.errors
from opentelemetry.context import Context

from hami_common.errors import TransientError
from hami_common.events import AdmissionMessage, QuotaUsage

__all__ = ["EventPublisher", "Publisher"]

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """What the publisher needs from the bus (:class:`hami_common.bus.Bus` is one)."""

    async def publish(self, subject: str, event: msgspec.Struct, *, ctx: Context | None = None) -> None: ...


Connect = Callable[[], Awaitable[AbstractAsyncContextManager[Publisher]]]


@dataclass(eq=False)
class EventPublisher:
    """``offer()`` from the request path; ``await run(connect)`` in the app's task group."""

    capacity: int = 4096
    timeout: float = 0.5
    published: int = 0
    dropped: int = 0
    _queue: asyncio.Queue[tuple[str, AdmissionMessage, Context | None]] = field(init=False)

    def __post_init__(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.capacity)

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def offer(self, subject: str, event: AdmissionMessage, ctx: Context | None = None) -> None:
        try:
            self._queue.put_nowait((subject, event, ctx))
        except asyncio.QueueFull:
            self.dropped += 1

    async def run(self, connect: Connect) -> None:
        """Connect (retrying forever), then publish what is offered, until cancelled."""
        while True:
            try:
                connection = await connect()
            except TransientError as err:
                log.warning("admission events wait for NATS: %s", err)
                continue
            async with connection as bus:
                await self._pump(bus)

    async def _pump(self, bus: Publisher) -> None:
        while True:
            subject, event, ctx = await self._queue.get()
            try:
                async with asyncio.timeout(self.timeout):
                    await bus.publish(subject, event, ctx=ctx)
            except (nats.errors.Error, OSError, TimeoutError) as err:
                self.dropped += 1
                about = event.namespace if isinstance(event, QuotaUsage) else event.pod_uid or event.name
                log.info("%s event about %s dropped: %r", type(event).__name__, about, err)
            else:
                self.published += 1
