"""The apiserver's side of pod creation: a mutating webhook call, then the create.

The API emulator does not call webhooks, so the stack does what kube-apiserver does for a pod CREATE: it
wraps the pod in an ``admission.k8s.io/v1`` AdmissionReview, posts it to the webhook over HTTPS (trusting
only the stack's CA), applies the returned JSONPatch, and creates the mutated pod through the API. On the
real kube-apiserver the same class only creates the pod: the apiserver calls the webhook itself.
"""

from __future__ import annotations

import base64
import copy
import ssl
import uuid
from http import HTTPStatus
from typing import Any, Final

import msgspec

from hami_common.errors import InvalidInput, TransientError
from hami_sim.http import HttpClient, HttpError
from hami_sim.kubeapi import PatchError, apply_json_patch

__all__ = ["ADMISSION_V1", "WEBHOOK_PATH", "AdmissionDenied", "Admitter"]

ADMISSION_V1: Final = "admission.k8s.io/v1"
WEBHOOK_PATH: Final = "/webhook"
READYZ_PATH: Final = "/readyz"
JSON_PATCH: Final = "JSONPatch"
SUBMITTER: Final = "kubernetes-admin"  # the user `hami submit` acts as (a tenant, not a system account)
_DENIED: Final = "denied the request"  # kube-apiserver's words for a webhook's refusal
_TIMEOUT_S: Final = 10.0  # kube-apiserver's default webhook timeout
Json = dict[str, Any]


class AdmissionDenied(InvalidInput):
    """The webhook refused the pod; the message is the one kubectl would print."""


class _GroupVersionKind(msgspec.Struct, frozen=True):
    group: str
    version: str
    kind: str


class _GroupVersionResource(msgspec.Struct, frozen=True):
    group: str
    version: str
    resource: str


class _UserInfo(msgspec.Struct, frozen=True):
    username: str
    groups: tuple[str, ...]


class _Request(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    uid: str
    kind: _GroupVersionKind
    resource: _GroupVersionResource
    namespace: str
    name: str
    operation: str
    user_info: _UserInfo
    object: msgspec.Raw
    dry_run: bool = False


class _Review(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str
    kind: str
    request: _Request


class _Status(msgspec.Struct, frozen=True):
    code: int = 0
    message: str = ""


class _Response(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    uid: str = ""
    allowed: bool = False
    status: _Status = msgspec.field(default_factory=_Status)
    patch: str = ""  # base64 of a JSON patch
    patch_type: str = ""


class _Answer(msgspec.Struct, frozen=True):
    response: _Response


def canonical(pod: Json) -> Json:
    """The pod as the apiserver holds it after decoding: resource quantities are strings (``2``, not 2)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return pod
    for key in ("initContainers", "containers"):
        containers = spec.get(key)
        for container in containers if isinstance(containers, list) else ():
            resources = container.get("resources") if isinstance(container, dict) else None
            if not isinstance(resources, dict):
                continue
            for field in ("limits", "requests"):
                values = resources.get(field)
                if isinstance(values, dict):
                    resources[field] = {k: v if isinstance(v, str) else str(v) for k, v in values.items()}
    return pod


class Admitter:
    """``await admitter.create(pod)``: admission through the webhook, then the create; returns the stored pod."""

    def __init__(
        self,
        webhook_url: str,
        ca_file: str,
        api_url: str,
        *,
        api_tls: ssl.SSLContext | None = None,
        review: bool = True,
    ) -> None:
        """``review=False``: the apiserver calls the webhook itself (the real kube-apiserver), so the pod is
        only created, and a denial comes back in the apiserver's answer."""
        self._webhook = HttpClient(
            webhook_url, ssl_context=ssl.create_default_context(cafile=ca_file), timeout=_TIMEOUT_S
        )
        self._api = HttpClient(api_url, ssl_context=api_tls, timeout=_TIMEOUT_S)
        self._review = review
        self._namespaces: set[str] = set()

    async def close(self) -> None:
        await self._webhook.aclose()
        await self._api.aclose()

    async def ready(self) -> bool:
        """Whether the webhook answers its readiness probe over TLS (False while it starts)."""
        try:
            reply = await self._webhook.get(READYZ_PATH)
        except HttpError:
            return False
        return reply.status == HTTPStatus.OK

    async def review(self, pod: Json) -> Json:
        """The pod as the webhook mutated it; raises AdmissionDenied when it is refused."""
        pod = canonical(copy.deepcopy(pod))
        meta = pod.get("metadata") or {}
        review = _Review(
            api_version=ADMISSION_V1,
            kind="AdmissionReview",
            request=_Request(
                uid=str(uuid.uuid4()),
                kind=_GroupVersionKind("", "v1", "Pod"),
                resource=_GroupVersionResource("", "v1", "pods"),
                namespace=str(meta.get("namespace") or "default"),
                name=str(meta.get("name") or ""),
                operation="CREATE",
                user_info=_UserInfo(SUBMITTER, ("system:masters", "system:authenticated")),
                object=msgspec.Raw(msgspec.json.encode(pod)),
            ),
        )
        try:
            reply = await self._webhook.post(WEBHOOK_PATH, msgspec.json.encode(review))
        except HttpError as err:
            raise TransientError(f"webhook unreachable: {err}") from err
        if reply.status != HTTPStatus.OK:
            raise AdmissionDenied(f"webhook answered HTTP {reply.status}: {reply.text[:200]}")
        try:
            answer = msgspec.json.decode(reply.body, type=_Answer).response
        except msgspec.DecodeError as err:
            raise AdmissionDenied(f"webhook answered a malformed AdmissionReview: {err}") from err
        if not answer.allowed:
            raise AdmissionDenied(f"admission webhook denied the request: {answer.status.message}")
        if not answer.patch:
            return pod
        if answer.patch_type != JSON_PATCH:
            raise AdmissionDenied(f"webhook answered an unknown patch type {answer.patch_type!r}")
        try:
            mutated: Json = apply_json_patch(pod, msgspec.json.decode(base64.b64decode(answer.patch)))
        except (PatchError, ValueError, msgspec.DecodeError) as err:
            raise AdmissionDenied(f"webhook answered a patch that does not apply: {err}") from err
        return mutated

    async def _ensure_namespace(self, namespace: str) -> None:
        if namespace in self._namespaces:
            return
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        reply = await self._api.post("/api/v1/namespaces", msgspec.json.encode(body))
        if reply.status not in (HTTPStatus.CREATED, HTTPStatus.OK, HTTPStatus.CONFLICT):
            raise TransientError(f"cannot create namespace {namespace}: HTTP {reply.status}")
        self._namespaces.add(namespace)

    async def create(self, pod: Json) -> Json:
        """Admit ``pod`` and create it; the stored object (with its UID) is returned."""
        mutated = await self.review(pod) if self._review else canonical(copy.deepcopy(pod))
        namespace = str((mutated.get("metadata") or {}).get("namespace") or "default")
        mutated.setdefault("metadata", {})["namespace"] = namespace
        try:
            await self._ensure_namespace(namespace)
            reply = await self._api.post(f"/api/v1/namespaces/{namespace}/pods", msgspec.json.encode(mutated))
        except HttpError as err:
            raise TransientError(f"apiserver unreachable: {err}") from err
        if reply.status == HTTPStatus.CONFLICT:
            raise InvalidInput(f"pod {namespace}/{mutated['metadata'].get('name')} already exists")
        if reply.status >= HTTPStatus.BAD_REQUEST and _DENIED in reply.text:
            raise AdmissionDenied(str(reply.json().get("message") or reply.text[:500]))
        if reply.status >= HTTPStatus.BAD_REQUEST:
            raise InvalidInput(f"apiserver refused the pod: HTTP {reply.status}: {reply.text[:200]}")
        created: Json = reply.json()
        return created
