"""Who a connecting node service is: its Kubernetes service-account token, checked by the apiserver.

The kubelet binds a pod's projected token to the pod and its node; a TokenReview of it returns the node's
name in the ``authentication.kubernetes.io/node-name`` extra. Only tokens of the node DaemonSet's service
account, minted for the bus's audience, are accepted.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

import msgspec
from kubernetes import client

from hami_common.errors import InvalidInput
from hami_common.kube import KubeClient

__all__ = ["NODE_NAME_EXTRA", "TokenReviewVerifier", "TokenVerifier"]

NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"


class TokenVerifier(Protocol):
    async def node_of(self, token: str) -> str:
        """The node the token proves its bearer runs on; raises ``InvalidInput`` when it proves none,
        ``TransientError`` when it cannot be checked now."""
        ...


class _UserInfo(msgspec.Struct, kw_only=True):
    username: str = ""
    extra: dict[str, list[str]] = msgspec.field(default_factory=dict)


class _ReviewStatus(msgspec.Struct, kw_only=True):
    authenticated: bool = False
    user: _UserInfo = msgspec.field(default_factory=_UserInfo)
    audiences: list[str] = msgspec.field(default_factory=list)
    error: str = ""


class _TokenReview(msgspec.Struct, kw_only=True):
    status: _ReviewStatus = msgspec.field(default_factory=_ReviewStatus)


class TokenReviewVerifier:
    """The deployed verifier: the TokenReview API (the callout's service account may create reviews)."""

    def __init__(self, kube: KubeClient, *, username: str, audience: str) -> None:
        self._kube = kube
        self._api = client.AuthenticationV1Api(kube.api_client)
        self._username = username
        self._audience = audience

    async def node_of(self, token: str) -> str:
        body: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [self._audience]},
        }
        raw = await self._kube.call_raw("token review", self._api.create_token_review, body)
        status = self._kube.decode("token review", raw, _TokenReview).status
        return node_from_review(status, username=self._username, audience=self._audience)


def node_from_review(status: _ReviewStatus, *, username: str, audience: str) -> str:
    if not status.authenticated:
        raise InvalidInput(f"token not authenticated: {status.error or 'no reason given'}")
    if status.user.username != username:
        raise InvalidInput(f"token of {status.user.username!r}, not of the node services ({username})")
    if audience not in status.audiences:
        raise InvalidInput(f"token not minted for {audience!r}")
    nodes = status.user.extra.get(NODE_NAME_EXTRA, [])
    if len(nodes) != 1 or not nodes[0]:
        raise InvalidInput("token is not bound to a node (a pod's projected token is)")
    return nodes[0]
