"""The HTTP surface: routes Kubernetes REST paths onto the store and answers in the API's own forms."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from hami_sim.kubeapi import _discovery
from hami_sim.kubeapi._errors import ApiError, bad_request, gone, status_body
from hami_sim.kubeapi._handlers import Handlers
from hami_sim.kubeapi._objects import admission_view
from hami_sim.kubeapi._resources import ResourceType, find
from hami_sim.kubeapi._selectors import (
    Resolver,
    SelectorError,
    lookup,
    parse_field_selector,
    parse_label_selector,
)
from hami_sim.kubeapi._store import Store, object_key
from hami_sim.kubeapi._table import to_table, wants_table
from hami_sim.kubeapi._warnings import WARNING_HEADER, WarningRecorder
from hami_sim.kubeapi._webhooks import ADMIN, Caller, Webhooks

__all__ = ["create_app"]

log = logging.getLogger(__name__)
JsonObj = dict[str, Any]
RequestLog = deque[tuple[str, str]]
JSON: Final = "application/json"
_BATCH: Final = 256  # watch events written at most in one chunk

# The field selectors kube-apiserver supports per kind, besides metadata.name (and metadata.namespace for
# namespaced kinds); any other is 400.
_FIELDS: Final = {
    "pods": {
        "spec.nodeName",
        "spec.schedulerName",
        "status.phase",
        "spec.restartPolicy",
        "spec.serviceAccountName",
        "status.podIP",
        "status.nominatedNodeName",
        "spec.hostNetwork",
    },
    "nodes": {"spec.unschedulable"},
    "events": {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    },
    "namespaces": {"status.phase"},
}
# Deleting these answers with the object (upstream's ReturnDeletedObject); the others answer a Status.
_RETURNS_DELETED: Final = frozenset({"pods", "namespaces"})


def json_response(body: object, code: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=code, media_type=JSON)


@dataclass(frozen=True, slots=True)
class Target:
    rt: ResourceType
    namespace: str | None
    name: str | None
    sub: str


def _not_found_path(path: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f"the server could not find the requested resource ({path})",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]},
    )


def parse_target(parts: list[str], path: str) -> Target:
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif parts[0] == "apis" and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise _not_found_path(path)
    namespace = None
    nested = find(group, version, rest[2]) if rest[0] == "namespaces" and len(rest) >= 3 else None
    if nested is not None and nested.namespaced:
        namespace, rest = rest[1], rest[2:]
    rt = find(group, version, rest[0])
    if rt is None or len(rest) > 3 or (namespace is not None and not rt.namespaced):
        raise _not_found_path(path)
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else ""
    if sub and sub not in rt.subresources:
        raise _not_found_path(path)
    if not name and not rt.namespaced and namespace is None:
        return Target(rt, None, None, "")
    return Target(rt, namespace, name, sub)


def _field_allowed(rt: ResourceType) -> Any:
    extra = _FIELDS.get(rt.plural, set())
    meta = {"metadata.name", "metadata.namespace"} if rt.namespaced else {"metadata.name"}

    def allowed(path: str) -> bool:
        return path in meta or path in extra

    return allowed


def _resolver(rt: ResourceType) -> Resolver:
    """The fields upstream computes rather than reads: an event's ``source`` (its component, else the
    reporting component), a pod's ``status.podIP`` (the first of ``status.podIPs``)."""

    def event_field(obj: Mapping[str, Any], path: str) -> str:
        if path == "source":
            return lookup(obj, "source.component") or lookup(obj, "reportingComponent")
        return lookup(obj, path)

    def pod_field(obj: Mapping[str, Any], path: str) -> str:
        if path == "status.podIP":
            ips = (obj.get("status") or {}).get("podIPs") or []
            first = ips[0] if ips and isinstance(ips[0], dict) else {}
            return str(first.get("ip") or "") or lookup(obj, path)
        return lookup(obj, path)

    resolvers: dict[str, Resolver] = {"events": event_field, "pods": pod_field}
    return resolvers.get(rt.plural, lookup)


def _list_item(obj: JsonObj) -> JsonObj:
    """An item of a list as upstream serialises it: without ``kind`` and ``apiVersion``."""
    obj.pop("kind", None)
    obj.pop("apiVersion", None)
    return obj


def _deleted(rt: ResourceType, obj: JsonObj) -> JsonObj:
    if rt.plural in _RETURNS_DELETED:
        return obj
    meta = obj.get("metadata") or {}
    details: JsonObj = {"name": meta.get("name", "")}
    if rt.group:
        details["group"] = rt.group
    details.update(kind=rt.plural, uid=meta.get("uid", ""))
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}


class Api:
    def __init__(
        self, store: Store, server_address: str, bookmark_interval: float, requests: RequestLog | None = None
    ) -> None:
        self.store = store
        self.requests = requests
        self.handlers = Handlers(store)
        self.webhooks = Webhooks(store)
        self.server_address = server_address
        self.bookmark_interval = bookmark_interval

    async def handle(self, request: Request) -> Response:
        if self.requests is not None:
            self.requests.append((request.method, request.url.path))
        warnings = request.state.warnings = WarningRecorder()
        try:
            response = await self.dispatch(request)
        except ApiError as err:
            response = json_response(err.status(), err.code)
        except Exception as err:  # the one broad catch: any bug answers 500 in API form, the server lives on
            log.exception("emulator failed on %s %s", request.method, request.url.path)
            return json_response(status_body(500, "InternalError", f"Internal error occurred: {err}"), 500)
        for value in warnings.latin1():  # the webhooks' warnings, whether the request succeeded or not
            response.headers.append(WARNING_HEADER, value)
        return response

    async def dispatch(self, request: Request) -> Response:
        path = request.url.path
        parts = [p for p in path.split("/") if p]
        doc = _discovery.document(parts, self.server_address)
        if doc is not None:
            if request.method != "GET":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
            return doc if isinstance(doc, Response) else json_response(doc)
        if not parts:
            raise _not_found_path(path)
        target = parse_target(parts, path)
        query = request.query_params
        method = request.method
        dry_run = bool(query.get("dryRun"))
        if dry_run and not (method == "POST" and target.name is None and target.rt.plural != "bindings"):
            # a dry-run create is how a client asks what admission makes of an object; nothing else has one
            raise bad_request("dryRun is supported by the emulator for creates only")
        if target.name is None:
            if method == "GET":
                if query.get("watch") in ("1", "true"):
                    return await self.watch(request, target)
                return self.list(request, target)
            if target.namespace is None and target.rt.namespaced:
                raise ApiError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            if method == "POST":
                body = await self._body(request)
                if target.rt.plural == "bindings":
                    return json_response(self.handlers.bind(target.namespace, None, body), 201)
                return json_response(await self.create(request, target, body, dry_run=dry_run), 201)
            if method == "DELETE":
                items, rv = self._select(request, target)
                for obj in items:
                    self.store.delete(target.rt, target.namespace, obj["metadata"]["name"])
                return json_response(
                    {
                        "kind": target.rt.list_kind,
                        "apiVersion": target.rt.api_version,
                        "metadata": {"resourceVersion": str(rv)},
                        "items": [_list_item(obj) for obj in items],
                    }
                )
        else:
            name = target.name
            if target.sub == "binding":
                if method != "POST":
                    raise ApiError(405, "MethodNotAllowed", "the server does not allow this method")
                body = await self._body(request)
                return json_response(self.handlers.bind(target.namespace, name, body), 201)
            if method == "GET":
                return self.get(request, target, name)
            if method == "PUT":
                body = await self._body(request)
                return json_response(self.handlers.replace(target.rt, target.namespace, name, body, target.sub))
            if method == "PATCH":
                content_type = request.headers.get("content-type", "").split(";")[0].strip()
                body = await self._body(request)
                return json_response(
                    self.handlers.patch(target.rt, target.namespace, name, content_type, body, target.sub)
                )
            if method == "DELETE" and not target.sub:
                raw = await request.body()
                options = self._decode(raw) if raw.strip() else {}
                deleted = self.handlers.delete(target.rt, target.namespace, name, options)
                return json_response(_deleted(target.rt, deleted))
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    async def create(self, request: Request, target: Target, body: Any, *, dry_run: bool = False) -> JsonObj:
        """A create, after the mutating admission webhooks registered with the emulator have seen it; with
        ``dry_run`` the admitted object is answered and not stored (webhooks are called all the same, as
        kube-apiserver calls those with ``sideEffects: None``)."""
        if self.webhooks.wanted(target.rt):
            view = admission_view(target.rt, body, target.namespace)
            body = await self.webhooks.admit_create(
                target.rt, target.namespace, view, _caller(request), dry_run=dry_run, warnings=request.state.warnings
            )
        if dry_run:
            return self.store.dry_create(target.rt, target.namespace, body)
        return self.store.create(target.rt, target.namespace, body)

    def get(self, request: Request, target: Target, name: str) -> Response:
        obj = self.store.get(target.rt, target.namespace, name)
        if wants_table(request.headers.get("accept", "")):
            rv = str(obj["metadata"].get("resourceVersion", ""))
            include = request.query_params.get("includeObject", "PartialObjectMetadata")
            return json_response(to_table(target.rt, [obj], rv, include))
        return json_response(obj)

    @staticmethod
    def _decode(raw: bytes) -> Any:
        try:
            return msgspec.json.decode(raw)
        except msgspec.DecodeError as err:
            raise bad_request(f"invalid JSON in request body: {err}") from None

    async def _body(self, request: Request) -> Any:
        raw = await request.body()
        if not raw.strip():
            raise bad_request("the request body is empty")
        return self._decode(raw)

    def _selectors(self, request: Request, target: Target) -> tuple[Any, Any]:
        query = request.query_params
        try:
            labels = parse_label_selector(query.get("labelSelector"))
            fields = parse_field_selector(query.get("fieldSelector"), _field_allowed(target.rt), _resolver(target.rt))
        except SelectorError as err:
            raise bad_request(str(err)) from None
        return labels, fields

    def _select(self, request: Request, target: Target) -> tuple[list[JsonObj], int]:
        labels, fields = self._selectors(request, target)
        return self.store.list_matching(target.rt, target.namespace, labels, fields)

    def list(self, request: Request, target: Target) -> Response:
        labels, fields = self._selectors(request, target)
        query = request.query_params
        start = query.get("continue")
        after = _continue_key(start) if start else None
        limit_text = query.get("limit") or ""
        limit = int(limit_text) if limit_text.isdigit() and int(limit_text) > 0 else None
        items, rv, remaining = self.store.list_page(target.rt, target.namespace, labels, fields, after, limit)
        metadata: JsonObj = {"resourceVersion": str(rv)}
        if remaining and items:
            metadata["continue"] = "/".join(object_key(items[-1]))
            metadata["remainingItemCount"] = remaining
        if wants_table(request.headers.get("accept", "")):
            table = to_table(target.rt, items, str(rv), query.get("includeObject", "PartialObjectMetadata"))
            table["metadata"] = metadata
            return json_response(table)
        return json_response(
            {
                "kind": target.rt.list_kind,
                "apiVersion": target.rt.api_version,
                "metadata": metadata,
                "items": [_list_item(obj) for obj in items],
            }
        )

    async def watch(self, request: Request, target: Target) -> Response:
        labels, fields = self._selectors(request, target)
        query = request.query_params
        since = query.get("resourceVersion")
        try:
            backlog, watcher = self.store.watch(
                target.rt, target.namespace, labels, fields, since, asyncio.get_running_loop()
            )
        except ApiError as err:
            if err.code != gone("").code:
                raise
            return StreamingResponse(_once(_line("ERROR", err.status())), media_type=JSON)
        timeout = float(query.get("timeoutSeconds") or 0) or None
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true")
        table = wants_table(request.headers.get("accept", ""))
        include = query.get("includeObject", "PartialObjectMetadata")

        def render(kind: str, obj: JsonObj) -> bytes:
            if table and kind != "BOOKMARK":
                rv = obj["metadata"].get("resourceVersion", "")
                return _line(kind, to_table(target.rt, [obj], rv, include, headers=False))
            return _line(kind, obj)

        async def stream() -> AsyncIterator[bytes]:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            try:
                for kind, obj in backlog:
                    yield render(kind, obj)
                while True:
                    wait = self.bookmark_interval if bookmarks else None
                    if deadline is not None:
                        left = deadline - loop.time()
                        if left <= 0:
                            return
                        wait = left if wait is None else min(wait, left)
                    try:
                        async with asyncio.timeout(wait):
                            item = await watcher.queue.get()
                    except TimeoutError:
                        if bookmarks:
                            rv = self.store.resource_version
                            await asyncio.sleep(0)  # let events committed up to rv reach the queue first
                            if watcher.queue.empty():
                                yield render("BOOKMARK", self._bookmark(target.rt, rv))
                        continue
                    # every event already queued goes out in one chunk: one write, not one per event
                    chunk = []
                    while item is not None:
                        chunk.append(render(*item))
                        if watcher.queue.empty() or len(chunk) >= _BATCH:
                            break
                        item = watcher.queue.get_nowait()
                    if chunk:
                        yield b"".join(chunk)
                    if item is None:
                        return
            finally:
                self.store.unwatch(watcher)

        return StreamingResponse(stream(), media_type=JSON)

    @staticmethod
    def _bookmark(rt: ResourceType, rv: int) -> JsonObj:
        return {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": {"resourceVersion": str(rv)}}


def _caller(request: Request) -> Caller:
    """Who the request is from: the admin, or whom it impersonates (``kubectl --as``, ``--as-group``)."""
    user = request.headers.get("impersonate-user")
    if not user:
        return ADMIN
    groups = request.headers.getlist("impersonate-group")
    return Caller(user, (*groups, "system:authenticated"))


def _continue_key(token: str) -> tuple[str, str]:
    """The (namespace, name) a ``continue`` token names; the list resumes after it."""
    namespace, _, name = token.rpartition("/")
    return (namespace, name)


def _line(kind: str, obj: JsonObj) -> bytes:
    return msgspec.json.encode({"type": kind, "object": obj}) + b"\n"


async def _once(chunk: bytes) -> AsyncIterator[bytes]:
    yield chunk


def create_app(
    store: Store, server_address: str, bookmark_interval: float = 1.0, requests: RequestLog | None = None
) -> Starlette:
    """The ASGI app; ``requests``, when given, records ``(method, path)`` of every request served."""
    api = Api(store, server_address, bookmark_interval, requests)
    methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(routes=[Route("/{path:path}", api.handle, methods=methods)])
