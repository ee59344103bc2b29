"""``KubeClient``: the project's only door to the apiserver, on the official ``kubernetes`` client.

Every call runs the blocking client in a worker thread (``asyncio.to_thread``, on purpose: the official
client is the reference implementation of the wire protocol) under ``asyncio.timeout``, asks for the raw
response (``_preload_content=False``) and decodes it with msgspec into :mod:`hami_common.kube._types`.
Client failures become :mod:`hami_common.errors` types here and nowhere else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Final, Self, TypeVar

import msgspec
import urllib3.exceptions
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hami_common.errors import Conflict, InvalidInput, NotFound, TransientError
from hami_common.kube._config import load_api_client
from hami_common.kube._errors import from_client_error
from hami_common.kube._patches import (
    AnnotationChanges,
    JsonPatchOp,
    MetadataPatch,
    json_patch_body,
    node_annotation_patch,
    pod_annotation_patch,
)
from hami_common.kube._settings import KubeSettings
from hami_common.kube._types import Event, Lease, Node, ObjectList, Pod, PodStatus, ResourceQuota

__all__ = ["JSON_PATCH", "MERGE_PATCH", "KubeClient"]

T = TypeVar("T")
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
_PAGE: Final = 500
_CLIENT_ERRORS: Final = (ApiException, urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)


class KubeClient:
    """Typed, async access to pods, nodes, bindings, resource quotas, leases and events."""

    def __init__(self, api_client: Any, settings: KubeSettings | None = None) -> None:
        self.settings = settings or KubeSettings()
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)

    @classmethod
    def from_settings(cls, settings: KubeSettings) -> KubeClient:
        return cls(load_api_client(settings), settings)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.to_thread(self.api_client.close)

    # --- plumbing ------------------------------------------------------------------------------------------

    async def call_raw(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
        """Run one client method without model decoding; return the body of its 2xx answer."""
        timeout = self.settings.kube_timeout

        def call() -> bytes:
            resp = fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
            try:
                data: bytes = resp.data
                return data
            finally:
                resp.release_conn()

        try:
            async with asyncio.timeout(timeout + 1.0):
                return await asyncio.to_thread(call)
        except _CLIENT_ERRORS as err:
            raise from_client_error(err, what) from err

    @staticmethod
    def decode(what: str, data: bytes, type_: type[T]) -> T:
        try:
            return msgspec.json.decode(data, type=type_)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            raise InvalidInput(f"{what}: undecodable answer from the apiserver: {err}") from err

    async def _get(self, what: str, type_: type[T], fn: Callable[..., Any], *args: Any) -> T:
        return self.decode(what, await self.call_raw(what, fn, *args), type_)

    async def list_all(self, what: str, type_: type[T], fn: Callable[..., Any], **kwargs: Any) -> tuple[list[T], str]:
        """Every item of a (paginated) list and the list's resourceVersion, to start a watch from."""
        list_type: Any = ObjectList[type_]  # type: ignore[valid-type]
        items: list[T] = []
        token, resource_version = "", ""
        while True:
            page_kwargs = dict(kwargs, limit=_PAGE)
            if token:
                page_kwargs["_continue"] = token
            page = self.decode(what, await self.call_raw(what, fn, **page_kwargs), list_type)
            items.extend(page.items)
            resource_version = resource_version or page.metadata.resource_version
            token = page.metadata.continue_
            if not token:
                return items, resource_version

    # --- reads ---------------------------------------------------------------------------------------------

    async def get_pod(self, namespace: str, name: str) -> Pod:
        return await self._get(f"pod {namespace}/{name}", Pod, self.core.read_namespaced_pod, name, namespace)

    async def get_node(self, name: str) -> Node:
        return await self._get(f"node {name}", Node, self.core.read_node, name)

    async def list_pods(
        self, namespace: str = "", *, label_selector: str = "", field_selector: str = ""
    ) -> tuple[list[Pod], str]:
        selectors = {"label_selector": label_selector, "field_selector": field_selector}
        if namespace:
            return await self.list_all(
                f"pods in {namespace}", Pod, self.core.list_namespaced_pod, namespace=namespace, **selectors
            )
        return await self.list_all("pods", Pod, self.core.list_pod_for_all_namespaces, **selectors)

    async def list_nodes(self, *, label_selector: str = "") -> tuple[list[Node], str]:
        return await self.list_all("nodes", Node, self.core.list_node, label_selector=label_selector)

    async def list_events(self, namespace: str = "", *, field_selector: str = "") -> list[Event]:
        """Events (``kubectl get events``), e.g. ``field_selector="reason=FailedScheduling"``."""
        if namespace:
            items, _ = await self.list_all(
                f"events in {namespace}", Event, self.core.list_namespaced_event,
                namespace=namespace, field_selector=field_selector,
            )  # fmt: skip
        else:
            items, _ = await self.list_all(
                "events", Event, self.core.list_event_for_all_namespaces, field_selector=field_selector
            )
        return items

    async def get_resource_quota(self, namespace: str, name: str) -> ResourceQuota:
        return await self._get(
            f"resourcequota {namespace}/{name}",
            ResourceQuota,
            self.core.read_namespaced_resource_quota,
            name,
            namespace,
        )

    async def list_resource_quotas(self, namespace: str = "") -> list[ResourceQuota]:
        if namespace:
            items, _ = await self.list_all(
                f"resourcequotas in {namespace}",
                ResourceQuota,
                self.core.list_namespaced_resource_quota,
                namespace=namespace,
            )
        else:
            items, _ = await self.list_all(
                "resourcequotas", ResourceQuota, self.core.list_resource_quota_for_all_namespaces
            )
        return items

    # --- annotation patches --------------------------------------------------------------------------------

    async def patch_pod(self, namespace: str, name: str, patch: MetadataPatch) -> Pod:
        what = f"pod {namespace}/{name}"
        data = await self.call_raw(
            what, self.core.patch_namespaced_pod, name, namespace, patch.to_json(), _content_type=MERGE_PATCH
        )
        return self.decode(what, data, Pod)

    async def patch_node(self, name: str, patch: MetadataPatch) -> Node:
        what = f"node {name}"
        data = await self.call_raw(what, self.core.patch_node, name, patch.to_json(), _content_type=MERGE_PATCH)
        return self.decode(what, data, Node)

    async def patch_pod_status(self, namespace: str, name: str, status: PodStatus) -> Pod:
        """Merge ``status`` into the pod's status subresource, as the kubelet reports a pod's phase."""
        what = f"status of pod {namespace}/{name}"
        body = {"status": msgspec.to_builtins(status)}
        data = await self.call_raw(
            what, self.core.patch_namespaced_pod_status, name, namespace, body, _content_type=MERGE_PATCH
        )
        return self.decode(what, data, Pod)

    async def patch_pod_annotations(
        self, namespace: str, name: str, changes: AnnotationChanges, *, resource_version: str = ""
    ) -> Pod:
        """Merge ``changes`` into the pod's annotations (None removes); sets the vgpu-node label with it."""
        return await self.patch_pod(namespace, name, pod_annotation_patch(changes, resource_version=resource_version))

    async def patch_pod_guarded(self, namespace: str, name: str, ops: list[JsonPatchOp]) -> Pod:
        """Apply a JSON patch built by :func:`guarded_annotation_patch`: a failed ``test`` (kube-apiserver's
        422) is the object having changed since it was read, so it raises :class:`Conflict`, as a stale
        resourceVersion does."""
        what = f"pod {namespace}/{name}"
        try:
            data = await self.call_raw(
                what, self.core.patch_namespaced_pod, name, namespace, json_patch_body(ops), _content_type=JSON_PATCH
            )
        except InvalidInput as err:
            raise Conflict(f"{what} changed since it was read: {err}") from err
        return self.decode(what, data, Pod)

    async def patch_node_annotations(
        self, name: str, changes: AnnotationChanges, *, resource_version: str = ""
    ) -> Node:
        """Merge ``changes`` into the node's annotations; with ``resource_version``, 409 → Conflict."""
        return await self.patch_node(name, node_annotation_patch(changes, resource_version=resource_version))

    # --- binding -------------------------------------------------------------------------------------------

    async def bind_pod(
        self, namespace: str, name: str, node: str, *, uid: str = "", annotations: Mapping[str, str] | None = None
    ) -> None:
        """POST ``pods/binding`` once. Never retried: a pod bound already answers 409 → :class:`Conflict`.

        The answer is read raw, so the client's failure to decode the ``Status`` the apiserver returns as a
        ``V1Binding`` (kubernetes-client/python#825) cannot turn a successful bind into an error. When the
        outcome is unknown (timeout, dropped connection), the pod is read back instead of binding again.
        """
        what = f"binding of pod {namespace}/{name} to {node}"
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(
                name=name, namespace=namespace, uid=uid or None, annotations=dict(annotations or {}) or None
            ),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        try:
            await self.call_raw(what, self.core.create_namespaced_pod_binding, name, namespace, body)
        except TransientError:
            pod = await self.get_pod(namespace, name)
            if pod.spec.node_name == node and (not uid or pod.metadata.uid == uid):
                return  # the first attempt did land
            if pod.spec.node_name:
                raise Conflict(f"{what}: pod is bound to {pod.spec.node_name}") from None
            raise

    async def finish_deletion(self, namespace: str, name: str, uid: str) -> None:
        """Delete a terminating pod at once (grace 0), as its kubelet does once the containers have stopped;
        the UID precondition spares a new pod of the same name. A pod already gone is no error."""
        what = f"deletion of pod {namespace}/{name}"
        options = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid))
        try:
            await self.call_raw(what, self.core.delete_namespaced_pod, name, namespace, body=options)
        except NotFound:
            return

    # --- leases --------------------------------------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> Lease:
        return await self._get(
            f"lease {namespace}/{name}", Lease, self.coordination.read_namespaced_lease, name, namespace
        )

    @staticmethod
    def _lease_body(lease: Lease) -> dict[str, Any]:
        body: dict[str, Any] = msgspec.to_builtins(lease)
        body.update(apiVersion="coordination.k8s.io/v1", kind="Lease")
        return body

    async def create_lease(self, lease: Lease) -> Lease:
        meta = lease.metadata
        what = f"lease {meta.namespace}/{meta.name}"
        data = await self.call_raw(
            what, self.coordination.create_namespaced_lease, meta.namespace, self._lease_body(lease)
        )
        return self.decode(what, data, Lease)

    async def replace_lease(self, lease: Lease) -> Lease:
        """Write ``lease`` back; its resourceVersion guards the write (409 → Conflict)."""
        meta = lease.metadata
        what = f"lease {meta.namespace}/{meta.name}"
        data = await self.call_raw(
            what, self.coordination.replace_namespaced_lease, meta.name, meta.namespace, self._lease_body(lease)
        )
        return self.decode(what, data, Lease)

    # --- events --------------------------------------------------------------------------------------------

    async def create_event(self, event: Event) -> None:
        namespace = event.metadata.namespace
        body: dict[str, Any] = msgspec.to_builtins(event)
        await self.call_raw(f"event in {namespace}", self.core.create_namespaced_event, namespace, body)

    async def patch_event(self, namespace: str, name: str, count: int, last_timestamp: str, message: str) -> None:
        """Count one more occurrence of an event, as client-go's recorder does (404 → NotFound)."""
        body = {"count": count, "lastTimestamp": last_timestamp, "message": message}
        await self.call_raw(
            f"event {namespace}/{name}", self.core.patch_namespaced_event, name, namespace, body,
            _content_type=MERGE_PATCH,
        )  # fmt: skip
