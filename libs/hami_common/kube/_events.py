"""Recording core/v1 Events about pods and nodes, as ``kubectl describe`` shows them, the way client-go does.

client-go's EventRecorder passes every event through an EventCorrelator
(``k8s.io/client-go/tools/record/events_cache.go``) before it writes, and this recorder does the same:

* **dedup**: an event equal to an earlier one (same source, object, type, reason and message) is not a new
  object: the earlier one is PATCHed with ``count + 1`` and a new ``lastTimestamp``;
* **aggregation**: from the 10th distinct message with the same source, object, type and reason within 10
  minutes, the events fold into one ``(combined from similar events): <latest message>`` event, itself
  counted by dedup;
* **spam filter**: a token bucket per source and object (burst 25, one token per 5 minutes) drops the rest.

So a pod that fails the same way at every scheduling attempt has one Event whose count grows, not one
Event per attempt. The caches are bounded (least recently used entries go first, 4096 as in client-go).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Generic, Literal, Protocol, TypeVar

from hami_common.errors import HamiError, NotFound
from hami_common.kube._types import Event, EventSource, ObjectMeta, ObjectReference

__all__ = [
    "AGGREGATE_MAX_EVENTS",
    "COMBINED_PREFIX",
    "FAILED_SCHEDULING",
    "SPAM_BURST",
    "EventPort",
    "EventRecorder",
    "EventType",
    "reference_to",
]

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]
FAILED_SCHEDULING: Final = "FailedScheduling"  # the Event reason kube-scheduler records for a pod left pending
_NAME_SUFFIX_BYTES: Final = 8
# client-go's defaults (k8s.io/client-go/tools/record/events_cache.go).
CACHE_ENTRIES: Final = 4096  # maxLruCacheEntries
AGGREGATE_MAX_EVENTS: Final = 10  # defaultAggregateMaxEvents
AGGREGATE_INTERVAL: Final = dt.timedelta(seconds=600)  # defaultAggregateIntervalInSeconds
SPAM_BURST: Final = 25  # defaultSpamBurst
SPAM_QPS: Final = 1.0 / 300.0  # defaultSpamQPS
COMBINED_PREFIX: Final = "(combined from similar events): "

K = TypeVar("K")
V = TypeVar("V")


class EventPort(Protocol):
    async def create_event(self, event: Event) -> None: ...

    async def patch_event(self, namespace: str, name: str, count: int, last_timestamp: str, message: str) -> None: ...


class _Object(Protocol):
    @property
    def metadata(self) -> ObjectMeta: ...


def reference_to(obj: _Object, kind: str, api_version: str = "v1") -> ObjectReference:
    meta = obj.metadata
    return ObjectReference(
        api_version=api_version,
        kind=kind,
        namespace=meta.namespace,
        name=meta.name,
        uid=meta.uid,
        resource_version=meta.resource_version,
    )


def _timestamp(now: dt.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


class _Lru(Generic[K, V]):
    """A bounded map that forgets the least recently used entry first (client-go's golang-lru)."""

    def __init__(self, size: int = CACHE_ENTRIES) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)


_ObjectKey = tuple[str, str, str, str, str, str, str]  # source component, host, kind, namespace, name, uid, apiVersion
_AggregateKey = tuple[_ObjectKey, str, str]  # + type, reason
_EventKey = tuple[_AggregateKey, str]  # + message


@dataclass(slots=True)
class _Similar:
    """Distinct messages seen for one aggregate key, and when the latest came."""

    messages: set[str]
    last: dt.datetime


@dataclass(slots=True)
class _Logged:
    """An event as the apiserver holds it: its name, first time and count."""

    name: str
    first_timestamp: str
    count: int


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: dt.datetime


@dataclass(eq=False)
class EventRecorder:
    """``await recorder.record(ref, "Normal", "BindingSucceed", "...")``. Recording is best effort: a
    failure is logged, never raised, since an event must not fail the operation it describes."""

    port: EventPort
    component: str
    host: str = ""
    clock: Callable[[], dt.datetime] = field(default=lambda: dt.datetime.now(dt.UTC))
    spam_burst: int = SPAM_BURST
    spam_qps: float = SPAM_QPS
    created: int = 0  # new Event objects written
    patched: int = 0  # occurrences counted on an existing Event
    dropped: int = 0  # refused by the spam filter
    _similar: _Lru[_AggregateKey, _Similar] = field(default_factory=_Lru)
    _logged: _Lru[_EventKey | _AggregateKey, _Logged] = field(default_factory=_Lru)
    _buckets: _Lru[_ObjectKey, _Bucket] = field(default_factory=_Lru)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def build(self, ref: ObjectReference, type_: EventType, reason: str, message: str) -> Event:
        stamp = _timestamp(self.clock())
        namespace = ref.namespace or "default"  # events about cluster-scoped objects live in "default"
        return Event(
            metadata=ObjectMeta(name=f"{ref.name}.{secrets.token_hex(_NAME_SUFFIX_BYTES)}", namespace=namespace),
            involved_object=ref,
            reason=reason,
            message=message,
            type=type_,
            first_timestamp=stamp,
            last_timestamp=stamp,
            source=EventSource(component=self.component, host=self.host),
            reporting_component=self.component,
            reporting_instance=self.host,
        )

    def _object_key(self, ref: ObjectReference) -> _ObjectKey:
        return (self.component, self.host, ref.kind, ref.namespace, ref.name, ref.uid, ref.api_version)

    def _allowed(self, key: _ObjectKey, now: dt.datetime) -> bool:
        """The spam filter: one token per event, ``spam_burst`` at most, refilled at ``spam_qps``."""
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = _Bucket(float(self.spam_burst), now)
        else:
            elapsed = max((now - bucket.at).total_seconds(), 0.0)
            bucket = _Bucket(min(float(self.spam_burst), bucket.tokens + elapsed * self.spam_qps), now)
        allowed = bucket.tokens >= 1.0
        if allowed:
            bucket.tokens -= 1.0
        self._buckets.put(key, bucket)
        return allowed

    def _aggregate(self, key: _AggregateKey, message: str, now: dt.datetime) -> tuple[_EventKey | _AggregateKey, str]:
        """The dedup key and message: the event's own, or the combined event's once similar ones pile up."""
        similar = self._similar.get(key)
        if similar is None or now - similar.last > AGGREGATE_INTERVAL:
            similar = _Similar(set(), now)
        similar.messages.add(message)
        similar.last = now
        self._similar.put(key, similar)
        if len(similar.messages) < AGGREGATE_MAX_EVENTS:
            return (key, message), message
        similar.messages.discard(message)  # client-go's PopAny: the set stays at its maximum, never above
        return key, COMBINED_PREFIX + message

    async def record(self, ref: ObjectReference, type_: EventType, reason: str, message: str) -> bool:
        """Create the event, or count it on the earlier equal one; return whether the apiserver took it."""
        async with self._lock:  # one writer: a patch must see the count the previous write left
            return await self._record(ref, type_, reason, message)

    async def _record(self, ref: ObjectReference, type_: EventType, reason: str, message: str) -> bool:
        now = self.clock()
        object_key = self._object_key(ref)
        key, message = self._aggregate((object_key, type_, reason), message, now)
        if not self._allowed(object_key, now):
            self.dropped += 1
            return False
        event = self.build(ref, type_, reason, message)
        stamp = event.last_timestamp or _timestamp(now)
        logged = self._logged.get(key)
        try:
            if logged is not None:
                try:
                    await self.port.patch_event(event.metadata.namespace, logged.name, logged.count + 1, stamp, message)
                    self._logged.put(key, _Logged(logged.name, logged.first_timestamp, logged.count + 1))
                    self.patched += 1
                    return True
                except NotFound:
                    pass  # deleted meanwhile (events expire after an hour): write it afresh, as client-go does
            await self.port.create_event(event)
        except HamiError as err:
            log.warning("event %s about %s/%s not recorded: %s", reason, ref.namespace, ref.name, err)
            return False
        self._logged.put(key, _Logged(event.metadata.name, stamp, 1))
        self.created += 1
        return True
