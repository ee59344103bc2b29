"""List+watch caches: a local copy of pods or nodes, kept current, that tells handlers what changed.

The loop: list (remember the list's resourceVersion), then watch from it. Each event and each bookmark
advances the version, so a broken connection resumes where it stopped, after a jittered backoff. A
``410 Gone`` (the version was compacted away) leads to a fresh list, whose difference from the cache is
delivered to handlers as ordinary ADDED / MODIFIED / DELETED changes, so no handler misses a change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar

from hami_common.errors import HamiError, InvalidInput
from hami_common.kube._retry import Backoff
from hami_common.kube._stream import ListWatcher, WatchItem
from hami_common.kube._types import ObjectMeta

__all__ = ["Change", "ChangeType", "WatchCache", "WatchStats"]

log = logging.getLogger(__name__)

T = TypeVar("T")
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]
_GONE: Final = 410


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """What a handler receives: the object now (on DELETED: its last state) and, on MODIFIED, before."""

    type: ChangeType
    obj: T
    old: T | None = None


@dataclass(slots=True)
class WatchStats:
    """Counters a test or a metric can read: how often the cache listed, reconnected, saw bad input."""

    lists: int = 0
    watches: int = 0
    reconnects: int = 0
    gone: int = 0
    malformed: int = 0
    handler_errors: int = 0


def _meta(obj: Any) -> ObjectMeta:
    meta = obj.metadata
    assert isinstance(meta, ObjectMeta)
    return meta


def _key(obj: Any) -> tuple[str, str]:
    meta = _meta(obj)
    return meta.namespace, meta.name


class _Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


@dataclass(eq=False)
class WatchCache(Generic[T]):
    """``async with asyncio.TaskGroup() as tg: tg.create_task(cache.run())``; then ``await cache.synced.wait()``."""

    source: ListWatcher[T]
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.2, cap=10.0))
    name: str = "objects"
    stats: WatchStats = field(default_factory=WatchStats)
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    resource_version: str = ""
    _items: dict[tuple[str, str], T] = field(default_factory=dict)
    _handlers: list[Callable[[Change[T]], None]] = field(default_factory=list)
    _rng: random.Random = field(default_factory=random.Random)

    # --- reading -------------------------------------------------------------------------------------------

    def get(self, namespace: str, name: str) -> T | None:
        """The cached object; cluster-scoped objects (nodes) have namespace ``""``."""
        return self._items.get((namespace, name))

    def items(self) -> list[T]:
        return list(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._items.values()))

    def add_handler(self, handler: Callable[[Change[T]], None]) -> None:
        """Call ``handler`` for every later change; it runs on the event loop and must not block."""
        self._handlers.append(handler)

    # --- the loop ------------------------------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled. Errors of the apiserver are retried forever, with backoff."""
        failures = 0
        while True:
            try:
                if not self.resource_version:
                    await self._relist()
                progressed = await self._watch()
                failures = 0 if progressed else failures + 1
            except _Gone:
                self.stats.gone += 1
                self.resource_version = ""
                continue
            except HamiError as err:
                failures += 1
                self.stats.reconnects += 1
                log.info("watch of %s broke (%s); retrying", self.name, err)
            if failures:
                await asyncio.sleep(self.backoff.delay(min(failures - 1, 16), self._rng))

    async def _relist(self) -> None:
        items, version = await self.source.list_objects()
        self.stats.lists += 1
        fresh = {_key(obj): obj for obj in items}
        for key, gone in list(self._items.items()):
            if key not in fresh:
                del self._items[key]
                self._notify(Change("DELETED", gone))
        for key, obj in fresh.items():
            previous = self._items.get(key)
            self._items[key] = obj
            if previous is None:
                self._notify(Change("ADDED", obj))
            elif _meta(previous).resource_version != _meta(obj).resource_version:
                self._notify(Change("MODIFIED", obj, previous))
        self.resource_version = version
        self.synced.set()

    async def _watch(self) -> bool:
        """Follow one watch until it ends; True if it delivered anything (the connection was healthy)."""
        self.stats.watches += 1
        progressed = False
        stream = self.source.watch_objects(self.resource_version)
        async with contextlib.aclosing(stream):  # type: ignore[type-var]
            async for item in stream:
                progressed = True
                self._apply(item)
        return progressed

    def _apply(self, item: WatchItem[T]) -> None:
        if item.type == "MALFORMED":
            self.stats.malformed += 1
            log.warning("skipped a malformed %s watch event: %s", self.name, item.status)
            return
        if item.type == "ERROR":
            status = item.status
            if status is not None and status.code == _GONE:
                raise _Gone
            raise InvalidInput(f"watch error: {status.message if status else 'unknown'}")
        if item.resource_version:
            self.resource_version = item.resource_version
        if item.type == "BOOKMARK" or item.obj is None:
            return
        obj = item.obj
        key = _key(obj)
        old = self._items.get(key)
        if item.type == "DELETED":
            self._items.pop(key, None)
            self._notify(Change("DELETED", obj))
        else:
            self._items[key] = obj
            self._notify(Change("MODIFIED", obj, old) if old is not None else Change("ADDED", obj))

    def _notify(self, change: Change[T]) -> None:
        for handler in self._handlers:
            try:
                handler(change)
            except Exception:  # an edge: one faulty handler must not stop the cache for the others
                self.stats.handler_errors += 1
                log.exception("handler of %s failed on %s", self.name, change.type)
