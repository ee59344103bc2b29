"""Placement decisions to the node's JetStream subject (ARCHITECTURE §3-4), best effort.

NATS is the nervous system, not the memory: when it is down, scheduling goes on (the allocator falls back
to the annotations); a failed publish is logged and counted, never an error of the bind.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import msgspec

from hami_common import logkeys, subjects
from hami_common.bus import Bus
from hami_common.errors import HamiError
from hami_common.events import PlacementDecision

__all__ = ["PlacementPublisher"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class PlacementPublisher:
    timeout: float = 2.0
    bus: Bus | None = None  # set once the connection is up
    published: int = 0
    failed: int = 0

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
