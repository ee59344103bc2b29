"""Kubernetes Events about pods, recorded off the request path: Filter and Bind only enqueue them."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Final

from hami_common.kube import EventRecorder, EventType, ObjectReference

__all__ = [
    "BINDING_FAILED",
    "BINDING_SUCCEED",
    "FILTERING_FAILED",
    "FILTERING_SUCCEED",
    "Notice",
    "NoticeQueue",
]

log = logging.getLogger(__name__)

# HAMi's event reasons (hami-protocol §4.4, §4.10).
FILTERING_SUCCEED: Final = "FilteringSucceed"
FILTERING_FAILED: Final = "FilteringFailed"
BINDING_SUCCEED: Final = "BindingSucceed"
BINDING_FAILED: Final = "BindingFailed"


@dataclass(frozen=True, slots=True)
class Notice:
    ref: ObjectReference
    type: EventType
    reason: str
    message: str


@dataclass(eq=False)
class NoticeQueue:
    """A bounded queue of events; when the apiserver is slow, the oldest pressure is shed, never the request."""

    maxsize: int = 1000
    # HAMi's success Events (FilteringSucceed, BindingSucceed) are two more apiserver writes per pod, and
    # kube-scheduler already records the placement as its own Scheduled event: off unless asked for.
    successes: bool = False
    dropped: int = 0
    recorded: int = 0
    _queue: asyncio.Queue[Notice] = field(init=False)

    def __post_init__(self) -> None:
        self._queue = asyncio.Queue(self.maxsize)

    def emit(self, ref: ObjectReference, type_: EventType, reason: str, message: str) -> None:
        if type_ == "Normal" and not self.successes:
            return
        try:
            self._queue.put_nowait(Notice(ref, type_, reason, message))
        except asyncio.QueueFull:
            self.dropped += 1

    async def run(self, recorder: EventRecorder) -> None:
        """Record queued events until cancelled (owned by the app's lifespan)."""
        while True:
            notice = await self._queue.get()
            if await recorder.record(notice.ref, notice.type, notice.reason, notice.message):
                self.recorded += 1

    def pending(self) -> int:
        return self._queue.qsize()
