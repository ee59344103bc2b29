"""Watch streams: the raw lines of a ``?watch=true`` response, decoded into typed watch items.

A watch holds its HTTP response open for minutes, so it reads in a dedicated daemon thread rather than
the shared ``to_thread`` pool, and hands each line to the event loop. Closing the iterator shuts the
socket down, which ends the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

import msgspec

from hami_common.errors import InvalidInput
from hami_common.kube._client import _CLIENT_ERRORS, KubeClient
from hami_common.kube._errors import from_client_error
from hami_common.kube._types import Node, ObjectMeta, Pod, ResourceQuota, Status, WatchEvent

__all__ = ["ListWatch", "ListWatcher", "WatchItem", "node_source", "pod_source", "quota_source"]

T = TypeVar("T")
EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "MALFORMED"]
_EVENT_TYPES: Final = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


class _Meta(msgspec.Struct, frozen=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


@dataclass(frozen=True, slots=True)
class WatchItem(Generic[T]):
    """One decoded watch event. ``obj`` is set for ADDED/MODIFIED/DELETED, ``status`` for ERROR;
    MALFORMED stands for a line that did not decode (``status.message`` says why) and is skipped."""

    type: EventType
    resource_version: str
    obj: T | None = None
    status: Status | None = None


class ListWatcher(Protocol[T]):
    """What a watch cache needs from the apiserver: a consistent list, and a watch from its version."""

    async def list_objects(self) -> tuple[Sequence[T], str]: ...

    def watch_objects(self, resource_version: str) -> AsyncIterator[WatchItem[T]]: ...


def decode_watch_line(line: bytes, item_type: type[T]) -> WatchItem[T]:
    """Decode one line of a watch stream; raises InvalidInput on anything malformed."""
    try:
        event = msgspec.json.decode(line, type=WatchEvent)
        if event.type not in _EVENT_TYPES:
            raise InvalidInput(f"unknown watch event type {event.type!r}")
        kind: EventType = event.type  # type: ignore[assignment]
        if kind == "ERROR":
            return WatchItem(kind, "", status=msgspec.json.decode(event.object, type=Status))
        if kind == "BOOKMARK":
            meta = msgspec.json.decode(event.object, type=_Meta).metadata
            return WatchItem(kind, meta.resource_version)
        obj = msgspec.json.decode(event.object, type=item_type)
    except (msgspec.DecodeError, msgspec.ValidationError) as err:
        raise InvalidInput(f"malformed watch event: {err}") from err
    found = getattr(obj, "metadata", None)
    return WatchItem(kind, found.resource_version if isinstance(found, ObjectMeta) else "", obj=obj)


def _pump(resp: Any, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[bytes | BaseException | None]) -> None:
    def put(item: bytes | BaseException | None) -> bool:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is gone
            return False
        return True

    buffer = b""
    try:
        for chunk in resp.stream(None, decode_content=True):
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip() and not put(line):
                    return
        put(None)
    except Exception as err:
        put(err)


def _shutdown(resp: Any) -> None:
    """Unblock the pump thread and give the connection back; a stream that already ended is left alone."""
    shutdown = getattr(resp, "shutdown", None)  # urllib3 >= 2.3
    if shutdown is not None and getattr(resp, "connection", None) is not None:
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            shutdown()
    with contextlib.suppress(OSError):
        resp.release_conn()


@dataclass(frozen=True, slots=True)
class ListWatch(Generic[T]):
    """A :class:`ListWatcher` over one client list method (``list_pod_for_all_namespaces``, ...)."""

    client: KubeClient
    what: str
    item_type: type[T]
    method: Callable[..., Any]
    selectors: tuple[tuple[str, str], ...] = ()

    async def list_objects(self) -> tuple[Sequence[T], str]:
        return await self.client.list_all(self.what, self.item_type, self.method, **dict(self.selectors))

    async def watch_objects(self, resource_version: str) -> AsyncIterator[WatchItem[T]]:
        settings = self.client.settings
        kwargs = dict(
            self.selectors,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=settings.kube_watch_seconds,
            _preload_content=False,
            _request_timeout=(settings.kube_timeout, settings.kube_watch_seconds + settings.kube_timeout),
        )
        try:
            async with asyncio.timeout(settings.kube_timeout + 1.0):
                resp = await asyncio.to_thread(self.method, **kwargs)
        except _CLIENT_ERRORS as err:
            raise from_client_error(err, f"watch of {self.what}") from err
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        threading.Thread(target=_pump, args=(resp, loop, queue), name=f"watch-{self.what}", daemon=True).start()
        try:
            while True:
                line = await queue.get()
                if line is None:
                    return
                if isinstance(line, BaseException):
                    if isinstance(line, _CLIENT_ERRORS):
                        raise from_client_error(line, f"watch of {self.what}") from line
                    raise line
                try:
                    yield decode_watch_line(line, self.item_type)
                except InvalidInput as err:
                    yield WatchItem("MALFORMED", "", status=Status(reason="Malformed", message=str(err)))
        finally:
            _shutdown(resp)


def _selectors(label_selector: str, field_selector: str) -> tuple[tuple[str, str], ...]:
    pairs = (("label_selector", label_selector), ("field_selector", field_selector))
    return tuple((k, v) for k, v in pairs if v)


def pod_source(client: KubeClient, *, label_selector: str = "", field_selector: str = "") -> ListWatch[Pod]:
    return ListWatch(
        client, "pods", Pod, client.core.list_pod_for_all_namespaces, _selectors(label_selector, field_selector)
    )


def node_source(client: KubeClient, *, label_selector: str = "", field_selector: str = "") -> ListWatch[Node]:
    return ListWatch(client, "nodes", Node, client.core.list_node, _selectors(label_selector, field_selector))


def quota_source(client: KubeClient) -> ListWatch[ResourceQuota]:
    return ListWatch(client, "resourcequotas", ResourceQuota, client.core.list_resource_quota_for_all_namespaces)
