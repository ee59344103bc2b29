"""The emulator's state: versioned objects, the event history watches resume from, and live watchers.

All state sits behind one lock, so the HTTP server (its own thread and loop) and test code (any thread)
can both touch it. The store outlives a server: stopping and restarting the emulator keeps every object,
every resourceVersion and the watch history.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from hami_sim.kubeapi._errors import STALE, ApiError, already_exists, conflict, conflict_on, gone, not_found
from hami_sim.kubeapi._objects import decode_defaults, pod_spec_change, prepare_create, validate
from hami_sim.kubeapi._resources import RESOURCES, ResourceType, find
from hami_sim.kubeapi._selectors import FieldSelector, LabelSelector

__all__ = ["Store", "WatchEvent", "Watcher"]

JsonObj = dict[str, Any]
Key = tuple[str, str, str]  # (group/plural, namespace, name)

DEFAULT_NAMESPACES: Final = ("default", "kube-system", "kube-public", "kube-node-lease")
_NAMESPACES: Final = find("", "v1", "namespaces")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _rt_key(rt: ResourceType) -> str:
    return f"{rt.group}/{rt.plural}"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One committed change; ``old`` is absent on ADDED, ``new`` is the object after the change
    (on DELETED: the last state, carrying the deletion's resourceVersion)."""

    rv: int
    type: str
    rt_key: str
    namespace: str
    old: JsonObj | None
    new: JsonObj


@dataclass(eq=False)
class Watcher:
    """A live watch: matching events are pushed onto ``queue`` from whichever thread commits them."""

    rt: ResourceType
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[str, JsonObj] | None] = field(default_factory=asyncio.Queue)

    def selects(self, obj: JsonObj | None) -> bool:
        return obj is not None and self.labels.matches(obj) and self.fields.matches(obj)

    def translate(self, event: WatchEvent) -> tuple[str, JsonObj] | None:
        """The event as this watcher sees it: moving out of its selection reads as DELETED, in as ADDED."""
        if event.rt_key != _rt_key(self.rt) or (self.namespace and event.namespace != self.namespace):
            return None
        was, now = self.selects(event.old), self.selects(event.new)
        if event.type == "DELETED":
            return ("DELETED", event.new) if was or self.selects(event.new) else None
        if now:
            return ("MODIFIED" if was else "ADDED", event.new)
        return ("DELETED", event.new) if was else None

    def push(self, item: tuple[str, JsonObj] | None) -> bool:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server went away
            return False
        return True


class Store:
    def __init__(self, history: int = 2000) -> None:
        self._lock = threading.RLock()
        self._objects: dict[Key, JsonObj] = {}
        self._rv = 0
        self._history: deque[WatchEvent] = deque(maxlen=history)
        self._oldest = 0  # watches may resume from any rv >= this
        self._changed: dict[str, int] = {}  # per kind: the resourceVersion of its last write
        self._watchers: set[Watcher] = set()
        self._stopping = False
        self._uids = (str(uuid.UUID(int=n + 1, version=4)) for n in itertools.count(0))
        for ns in DEFAULT_NAMESPACES:
            self.create(_ns_type(), None, {"metadata": {"name": ns}})

    # --- reads ---------------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def changed_at(self, rt: ResourceType) -> int:
        """The resourceVersion of the last write to an object of ``rt`` (0: never written): a cache key."""
        with self._lock:
            return self._changed.get(_rt_key(rt), 0)

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> JsonObj:
        with self._lock:
            obj = self._objects.get((_rt_key(rt), namespace or "", name))
            if obj is None:
                raise not_found(rt, name)
            return copy.deepcopy(obj)

    def list_matching(
        self, rt: ResourceType, namespace: str | None, labels: LabelSelector, fields: FieldSelector
    ) -> tuple[list[JsonObj], int]:
        with self._lock:
            items = [copy.deepcopy(obj) for obj in self._select(rt, namespace, labels, fields)]
            return items, self._rv

    def list_page(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        after: tuple[str, str] | None,
        limit: int | None,
    ) -> tuple[list[JsonObj], int, int]:
        """One page in (namespace, name) order after ``after``: (items, resourceVersion, items remaining).

        Only the page is copied, so paging through a large list costs linear, not quadratic, time.
        """
        with self._lock:
            matching = [
                obj for obj in self._select(rt, namespace, labels, fields) if after is None or object_key(obj) > after
            ]
            page = matching if limit is None else matching[:limit]
            return [copy.deepcopy(obj) for obj in page], self._rv, len(matching) - len(page)

    def _select(
        self, rt: ResourceType, namespace: str | None, labels: LabelSelector, fields: FieldSelector
    ) -> Iterator[JsonObj]:
        key = _rt_key(rt)
        for (k, ns, _), obj in sorted(self._objects.items()):
            if k == key and (not namespace or ns == namespace) and labels.matches(obj) and fields.matches(obj):
                yield obj

    # --- writes --------------------------------------------------------------------------------------------

    def _commit(self, rt: ResourceType, kind: str, old: JsonObj | None, new: JsonObj) -> JsonObj:
        self._rv += 1
        new = copy.deepcopy(new)
        new["metadata"]["resourceVersion"] = str(self._rv)
        metadata = new["metadata"]
        key = (_rt_key(rt), metadata.get("namespace", ""), metadata["name"])
        if kind == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = new
        self._changed[key[0]] = self._rv
        event = WatchEvent(self._rv, kind, key[0], key[1], old, new)
        self._history.append(event)
        if self._history.maxlen and len(self._history) == self._history.maxlen:
            self._oldest = self._history[0].rv - 1
        for watcher in list(self._watchers):
            item = watcher.translate(event)
            if item is not None and not watcher.push(item):
                self._watchers.discard(watcher)
        return copy.deepcopy(new)

    def _require_namespace(self, rt: ResourceType, namespace: str | None) -> None:
        if rt.namespaced and namespace and (_rt_key(_ns_type()), "", namespace) not in self._objects:
            raise not_found(_ns_type(), namespace)

    def create(self, rt: ResourceType, namespace: str | None, obj: JsonObj) -> JsonObj:
        with self._lock:
            self._require_namespace(rt, namespace)
            new = prepare_create(rt, obj, namespace if rt.namespaced else None, _now(), next(self._uids))
            name = new["metadata"]["name"]
            ns_key = (namespace or "") if rt.namespaced else ""
            if (_rt_key(rt), ns_key, name) in self._objects:
                raise already_exists(rt, name)
            return self._commit(rt, "ADDED", None, new)

    def dry_create(self, rt: ResourceType, namespace: str | None, obj: JsonObj) -> JsonObj:
        """What :meth:`create` would store, stored nowhere (a ``dryRun=All`` create)."""
        with self._lock:
            self._require_namespace(rt, namespace)
            return prepare_create(rt, obj, namespace if rt.namespaced else None, _now(), next(self._uids))

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        mutate: Callable[[JsonObj], JsonObj],
        subresource: str = "",
    ) -> JsonObj:
        """Read-modify-write under the lock: ``mutate`` gets a copy of the current object and returns the
        desired one. A resourceVersion in the result must match the current one (409 otherwise)."""
        with self._lock:
            current = self._objects.get((_rt_key(rt), namespace or "", name))
            if current is None:
                raise not_found(rt, name)
            desired = mutate(copy.deepcopy(current))
            return self._replace(rt, name, current, desired, subresource)

    def bind(self, rt: ResourceType, namespace: str | None, name: str, assign: Callable[[JsonObj], JsonObj]) -> JsonObj:
        """The binding write: ``assign`` may change what no update may (``spec.nodeName``)."""
        with self._lock:
            current = self._objects.get((_rt_key(rt), namespace or "", name))
            if current is None:
                raise not_found(rt, name)
            return self._commit(rt, "MODIFIED", current, assign(copy.deepcopy(current)))

    def _replace(self, rt: ResourceType, name: str, current: JsonObj, desired: JsonObj, subresource: str) -> JsonObj:
        metadata = desired.get("metadata") or {}
        if metadata.get("name", name) != name:
            raise ApiError(
                400,
                "BadRequest",
                f"the name of the object ({metadata.get('name')}) does not match the name on the URL ({name})",
            )
        wanted_rv = metadata.get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise conflict(rt, name, STALE)
        if metadata.get("uid") and metadata["uid"] != current["metadata"]["uid"]:
            raise conflict(rt, name, "Precondition failed: UID in precondition does not match")
        result = copy.deepcopy(desired)
        has_status = "status" in rt.subresources
        if subresource == "status":
            # a status write keeps its metadata (labels, annotations) but not its spec, as upstream
            if "spec" in current:
                result["spec"] = copy.deepcopy(current["spec"])
            if rt.plural == "pods":
                _keep(result, current, "ownerReferences")
        elif has_status:
            result["status"] = copy.deepcopy(current.get("status", {}))
        new_meta = dict(result.get("metadata") or {})
        for system in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
            if system in current["metadata"]:
                new_meta[system] = current["metadata"][system]
        new_meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        result["metadata"] = new_meta
        result["kind"], result["apiVersion"] = rt.kind, rt.api_version
        decode_defaults(rt, result)
        validate(rt, result)
        if rt.plural == "pods":
            pod_spec_change(rt, name, current, result)
        if result == current:
            return copy.deepcopy(current)  # a no-op write keeps the resourceVersion, as upstream does
        return self._commit(rt, "MODIFIED", current, result)

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        uid: str | None = None,
        rv: str | None = None,
        grace: int | None = None,
    ) -> JsonObj:
        """Delete now; returns the last state. A pod (or namespace) is first marked (``deletionTimestamp``, a
        MODIFIED event) as upstream marks it, then removed at once: no kubelet (or namespace controller)
        here finishes the deletion."""
        with self._lock:
            current = self._objects.get((_rt_key(rt), namespace or "", name))
            if current is None:
                raise not_found(rt, name)
            meta = current["metadata"]
            if uid and uid != meta["uid"]:
                why = f"the UID in the precondition ({uid}) does not match the UID in record ({meta['uid']}). "
                raise conflict_on(
                    rt.kind, rt.group, name, why + "The object might have been deleted and then recreated"
                )
            if rv and rv != meta["resourceVersion"]:
                why = f"the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record "
                raise conflict_on(
                    rt.kind, rt.group, name, f"{why}({meta['resourceVersion']}). The object might have been modified"
                )
            if rt.plural == "pods":
                current = self._commit(rt, "MODIFIED", current, _marked(current, grace))
            if rt.plural == "namespaces":
                current = self._commit(rt, "MODIFIED", current, _terminating(current))
                for (_, ns, _), obj in list(self._objects.items()):
                    if ns == name:
                        rt_of = find_kind(obj)
                        if rt_of is not None:
                            self._commit(rt_of, "DELETED", obj, obj)
            return self._commit(rt, "DELETED", current, current)

    # --- watches -------------------------------------------------------------------------------------------

    def watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        since: str | None,
        loop: asyncio.AbstractEventLoop,
    ) -> tuple[list[tuple[str, JsonObj]], Watcher]:
        """Register a watcher; return the events it must see first (a replay, or ADDED for every object)."""
        watcher = Watcher(rt, namespace, labels, fields, loop)
        with self._lock:
            if self._stopping:  # a client re-watching while the server stops would hold the shutdown up
                raise ApiError(503, "ServiceUnavailable", "the apiserver is shutting down")
            if not since or since == "0":
                backlog = [("ADDED", copy.deepcopy(o)) for o in self._select(rt, namespace, labels, fields)]
            else:
                try:
                    start = int(since)
                except ValueError:
                    raise ApiError(400, "BadRequest", f"invalid resource version {since!r}") from None
                if start < self._oldest:
                    raise gone(f"too old resource version: {start} ({self._oldest + 1})")
                backlog = []
                for event in self._history:
                    item = watcher.translate(event) if event.rv > start else None
                    if item is not None:
                        backlog.append((item[0], copy.deepcopy(item[1])))
            self._watchers.add(watcher)
            return backlog, watcher

    def unwatch(self, watcher: Watcher) -> None:
        with self._lock:
            self._watchers.discard(watcher)

    def close_watchers(self) -> None:
        """End every live watch and refuse new ones (the server is stopping) until :meth:`serve_watches`."""
        with self._lock:
            self._stopping = True
            for watcher in self._watchers:
                watcher.push(None)
            self._watchers.clear()

    def serve_watches(self) -> None:
        """Accept watches again (the server started)."""
        with self._lock:
            self._stopping = False

    def compact(self) -> int:
        """Forget the watch history, as etcd compaction does: resuming from an older rv now gets 410 Gone."""
        with self._lock:
            self._history.clear()
            self._oldest = self._rv
            return self._rv


def _keep(result: JsonObj, current: JsonObj, field: str) -> None:
    """``result`` keeps ``current``'s ``metadata.<field>`` (or its absence)."""
    meta = result.setdefault("metadata", {})
    meta.pop(field, None)
    if field in current.get("metadata", {}):
        meta[field] = copy.deepcopy(current["metadata"][field])


def _pod_grace(pod: JsonObj, grace: int | None) -> int:
    """Upstream's grace period for a pod delete: 0 for a pod on no node or one that has finished."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
        return 0
    if grace is None:
        grace = spec.get("terminationGracePeriodSeconds")
    if not isinstance(grace, int):
        return 30
    return 1 if grace < 0 else grace  # a negative period reads as one second


def _marked(pod: JsonObj, grace: int | None) -> JsonObj:
    marked = copy.deepcopy(pod)
    seconds = _pod_grace(pod, grace)
    meta = marked["metadata"]
    if not meta.get("deletionTimestamp"):
        meta["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + seconds))
        meta["deletionGracePeriodSeconds"] = seconds
    return marked


def _terminating(namespace: JsonObj) -> JsonObj:
    """A namespace being deleted, as upstream marks it before its namespace controller empties it."""
    marked = copy.deepcopy(namespace)
    marked["metadata"].setdefault("deletionTimestamp", _now())
    marked.setdefault("status", {})["phase"] = "Terminating"
    return marked


def _ns_type() -> ResourceType:
    assert _NAMESPACES is not None
    return _NAMESPACES


def find_kind(obj: JsonObj) -> ResourceType | None:
    for rt in RESOURCES:
        if rt.kind == obj.get("kind") and rt.api_version == obj.get("apiVersion"):
            return rt
    return None


def object_key(obj: JsonObj) -> tuple[str, str]:
    """The (namespace, name) order of lists and the position a ``continue`` token names."""
    metadata = obj.get("metadata") or {}
    return (metadata.get("namespace", ""), metadata.get("name", ""))
