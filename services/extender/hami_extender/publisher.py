"""Placement decisions to the node's JetStream subject (ARCHITECTURE §3-4), best effort; and the Filter's
refusals (:class:`~hami_common.events.FilterRefusal`) to ``hami.scheduling.<namespace>``, fire and forget.

NATS is the nervous system, not the memory: when it is down, scheduling goes on (the allocator falls back
to the annotations); a failed publish is logged and counted, never an error of the bind. A refusal is only
news for the web page: Filter offers it to a bounded queue and never waits for it; a full queue or a bus
that is down drops it (counted).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import msgspec

from hami_common import logkeys, subjects
from hami_common.bus import Bus
from hami_common.errors import HamiError
from hami_common.events import FilterRefusal, PlacementDecision

__all__ = ["PlacementPublisher"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class PlacementPublisher:
    timeout: float = 2.0
    bus: Bus | None = None  # set once the connection is up
    published: int = 0
    failed: int = 0
    refusal_capacity: int = 1024
    refusals_published: int = 0
    refusals_dropped: int = 0
    _refusals: asyncio.Queue[FilterRefusal] = field(init=False)

    def __post_init__(self) -> None:
        self._refusals = asyncio.Queue(maxsize=self.refusal_capacity)

    def offer_refusal(self, refusal: FilterRefusal) -> None:
        """From the Filter's path: queued for :meth:`run_refusals`, or dropped when the queue is full."""
        try:
            self._refusals.put_nowait(refusal)
        except asyncio.QueueFull:
            self.refusals_dropped += 1

    async def run_refusals(self) -> None:
        """Publish offered refusals on core NATS until cancelled; none is kept for a bus that is down."""
        while True:
            refusal = await self._refusals.get()
            bus = self.bus
            if bus is None or not bus.connected:
                self.refusals_dropped += 1
                continue
            try:
                async with asyncio.timeout(self.timeout):
                    await bus.publish(subjects.scheduling(refusal.namespace), refusal)
            except (HamiError, TimeoutError, msgspec.EncodeError) as err:
                self.refusals_dropped += 1
                log.debug("refusal of pod %s not published: %s", refusal.pod_uid, err or "timeout")
                continue
            self.refusals_published += 1

    async def publish(self, decision: PlacementDecision) -> bool:
        """Publish with the current trace context; a retry of the same decision is stored once."""
        bus = self.bus
        extra = {logkeys.POD_UID: decision.pod_uid, logkeys.NODE: decision.node}
        if bus is None or not bus.connected:
            self.failed += 1
            log.warning("placement of pod %s not published: NATS is not connected", decision.pod_uid, extra=extra)
            return False
        try:
            async with asyncio.timeout(self.timeout):
                await bus.publish_durable(
                    subjects.placement(decision.node),
                    decision,
                    msg_id=f"{decision.pod_uid}-{decision.bind_time_ns}",
                )
        except (HamiError, TimeoutError, msgspec.EncodeError) as err:
            self.failed += 1
            log.warning("placement of pod %s not published: %s", decision.pod_uid, err or "timeout", extra=extra)
            return False
        self.published += 1
        return True
