"""The ports services depend on instead of the concrete client, so tests can pass a fake or the real
client against the emulator. :class:`hami_common.kube.KubeClient` implements every one of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from hami_common.kube._events import EventPort
from hami_common.kube._leader import LeasePort
from hami_common.kube._patches import AnnotationChanges, JsonPatchOp
from hami_common.kube._types import Node, Pod, ResourceQuota

__all__ = [
    "EventPort",
    "LeasePort",
    "NodePatcher",
    "PodBinder",
    "PodGuardedPatcher",
    "PodPatcher",
    "PodReader",
    "QuotaReader",
]


class PodReader(Protocol):
    async def get_pod(self, namespace: str, name: str) -> Pod: ...


class PodPatcher(Protocol):
    async def patch_pod_annotations(
        self, namespace: str, name: str, changes: AnnotationChanges, *, resource_version: str = ""
    ) -> Pod: ...


class PodGuardedPatcher(Protocol):
    async def patch_pod_guarded(self, namespace: str, name: str, ops: list[JsonPatchOp]) -> Pod: ...


class NodePatcher(Protocol):
    async def get_node(self, name: str) -> Node: ...

    async def patch_node_annotations(
        self, name: str, changes: AnnotationChanges, *, resource_version: str = ""
    ) -> Node: ...


class PodBinder(Protocol):
    async def bind_pod(
        self, namespace: str, name: str, node: str, *, uid: str = "", annotations: Mapping[str, str] | None = None
    ) -> None: ...


class QuotaReader(Protocol):
    async def list_resource_quotas(self, namespace: str = "") -> list[ResourceQuota]: ...
