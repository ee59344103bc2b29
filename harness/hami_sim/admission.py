"""Pod creation as a user does it: a plain create through the apiserver, which calls the webhook itself.

Both stacks register the deployed MutatingWebhookConfiguration with their apiserver (kube-apiserver, or the
API emulator, which calls mutating webhooks as kube-apiserver does: rules, selectors, matchConditions), so a
pod the deployed configuration does not select never reaches the webhook here either. What this adds to the
create is what a user's namespace would already have: the namespace itself. A refusal comes back in the
apiserver's words (``admission webhook "<name>" denied the request: <message>``).
"""

from __future__ import annotations

import copy
import ssl
from http import HTTPStatus
from typing import Any, Final

import msgspec

from hami_common.errors import InvalidInput, TransientError
from hami_sim.http import HttpClient, HttpError

__all__ = ["AdmissionDenied", "Admitter"]

_DENIED: Final = "denied the request"  # kube-apiserver's words for a webhook's refusal
_CALL_FAILED: Final = "failed calling webhook"  # ... and for a webhook it could not call (failurePolicy Fail)
_TIMEOUT_S: Final = 30.0  # above kube-apiserver's webhook timeout (10 s), so its own answer comes back
_PROBE_POD: Final = "hami-webhook-probe"
Json = dict[str, Any]


class AdmissionDenied(InvalidInput):
    """The webhook refused the pod; the message is the one kubectl would print."""


class Admitter:
    """``await admitter.create(pod)``: the create through the apiserver; returns the stored pod."""

    def __init__(self, api_url: str, *, api_tls: ssl.SSLContext | None = None) -> None:
        self._api = HttpClient(api_url, ssl_context=api_tls, timeout=_TIMEOUT_S)
        self._namespaces: set[str] = set()

    async def close(self) -> None:
        await self._api.aclose()

    async def routes_to(self, scheduler: str, resource: str) -> bool:
        """Whether the apiserver's admission sends a pod asking for ``resource`` to ``scheduler`` now: a
        dry-run create, which calls the webhook and stores nothing (False while the webhook starts)."""
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": _PROBE_POD, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "probe", "resources": {"limits": {resource: "1"}}}]},
        }
        try:
            reply = await self._api.post("/api/v1/namespaces/default/pods?dryRun=All", msgspec.json.encode(probe))
        except HttpError:
            return False
        if reply.status >= HTTPStatus.BAD_REQUEST:
            return False
        return bool((reply.json().get("spec") or {}).get("schedulerName") == scheduler)

    async def _ensure_namespace(self, namespace: str) -> None:
        if namespace in self._namespaces:
            return
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        reply = await self._api.post("/api/v1/namespaces", msgspec.json.encode(body))
        if reply.status not in (HTTPStatus.CREATED, HTTPStatus.OK, HTTPStatus.CONFLICT):
            raise TransientError(f"cannot create namespace {namespace}: HTTP {reply.status}")
        self._namespaces.add(namespace)

    async def create(self, pod: Json) -> Json:
        """Create ``pod`` (its namespace first, if new); the stored object (with its UID) is returned."""
        pod = copy.deepcopy(pod)
        namespace = str((pod.get("metadata") or {}).get("namespace") or "default")
        pod.setdefault("metadata", {})["namespace"] = namespace
        try:
            await self._ensure_namespace(namespace)
            reply = await self._api.post(f"/api/v1/namespaces/{namespace}/pods", msgspec.json.encode(pod))
        except HttpError as err:
            raise TransientError(f"apiserver unreachable: {err}") from err
        if reply.status == HTTPStatus.CONFLICT:
            raise InvalidInput(f"pod {namespace}/{pod['metadata'].get('name')} already exists")
        if reply.status >= HTTPStatus.BAD_REQUEST:
            message = _message(reply.text)
            if _DENIED in message:
                raise AdmissionDenied(message)
            if _CALL_FAILED in message:
                raise TransientError(message)
            raise InvalidInput(f"apiserver refused the pod: HTTP {reply.status}: {message[:300]}")
        created: Json = reply.json()
        return created


def _message(text: str) -> str:
    """The ``message`` of the apiserver's Status, or the raw answer where it is not one."""
    try:
        status = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text[:500]
    return str(status.get("message") or text[:500]) if isinstance(status, dict) else text[:500]
