"""HAMi's fallback: find the pod the kubelet is allocating for from the apiserver (hami-protocol §5.4).

The kubelet's ``Allocate`` does not name its pod. Without a staged answer the plugin lists the pods bound to
its node and takes, as HAMi does, a Pending pod with ``hami.io/bind-time``, ``hami.io/bind-phase``
``allocating`` (or ``success``) and ``hami.io/vgpu-node`` equal to this node: the oldest by bind time whose
next entry of ``hami.io/vgpu-devices-to-allocate`` asks for the same number of devices. Entries this process
served but has not erased yet (the erasure runs after the answer) are counted as served (``inflight``: the
served containers' names per pod, so the answer is the same whether a listing predates the erasure or not).

Unlike HAMi, a pod's annotations are not trusted on their own: a pod is a candidate only when the scheduler's
signature ``hami.io/vgpu-grant`` verifies over its UID, node and device list (:mod:`hami_common.grants`), so a
pod that slipped past admission with forged annotations and a ``spec.nodeName`` is never served.

:func:`next_pending` is pure; :class:`KubeNodePods` is the adapter that reads the pods, with the
containers' ``env`` (``CUDA_DISABLE_CONTROL``), which the shared pod type does not carry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import msgspec

from hami_common import envvars
from hami_common.allocation import ContainerGrant, PodGrant, from_annotation, is_true
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    BIND_PHASE_SUCCESS,
    BIND_TIME,
    DEVICES_TO_ALLOCATE,
    MIG_ALLOCATIONS,
    TRACE_CONTEXT,
    VGPU_NODE,
    decode_mig_allocations,
    decode_pod_devices,
)
from hami_common.errors import AnnotationError, InvalidInput, NotFound
from hami_common.grants import GrantKey, unverified_reason
from hami_common.kube import KubeClient, ObjectMeta, PodStatus, ResourceRequirements
from hami_common.quantity import as_int
from hami_common.resources import GPU_PRIORITY

__all__ = [
    "BrokenPod",
    "KubeNodePods",
    "NodePods",
    "PendingAllocation",
    "PendingContainer",
    "PendingPod",
    "PendingPodSpec",
    "PodLike",
    "next_pending",
    "next_uuids",
    "pod_grant",
]

PENDING: Final = "Pending"
_PHASES: Final = frozenset({BIND_PHASE_ALLOCATING, BIND_PHASE_SUCCESS})


class _Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    pass


class EnvVar(_Wire, frozen=True):
    name: str
    value: str = ""


class PendingContainer(_Wire, frozen=True):
    name: str = ""
    env: tuple[EnvVar, ...] = ()
    resources: ResourceRequirements = msgspec.field(default_factory=ResourceRequirements)


class PendingPodSpec(_Wire, frozen=True):
    node_name: str = ""
    containers: tuple[PendingContainer, ...] = ()
    init_containers: tuple[PendingContainer, ...] = ()


class PendingPod(_Wire, frozen=True):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PendingPodSpec = msgspec.field(default_factory=PendingPodSpec)
    status: PodStatus = msgspec.field(default_factory=PodStatus)


class NodePods(Protocol):
    async def list_node_pods(self, node: str) -> list[PendingPod]: ...


class KubeNodePods:
    """:class:`NodePods` over the apiserver: one field-selected list per call, as HAMi's plugin does."""

    def __init__(self, client: KubeClient) -> None:
        self._client = client

    async def list_node_pods(self, node: str) -> list[PendingPod]:
        items, _ = await self._client.list_all(
            f"pods on node {node}",
            PendingPod,
            self._client.core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
        )
        return items


@dataclass(frozen=True, slots=True)
class PendingAllocation:
    """The container the kubelet is asking for, and what that means for its pod."""

    pod: PendingPod
    grant: ContainerGrant
    complete: bool  # no device entry of the pod is left after this one
    trace_context: str


class BrokenPod(InvalidInput):
    """The chosen pod's device list does not decode: HAMi marks such a pod ``failed``."""

    def __init__(self, pod: PendingPod, reason: str) -> None:
        super().__init__(f"pod {pod.metadata.namespace}/{pod.metadata.name}: {reason}")
        self.pod = pod
        self.reason = reason


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class _SpecLike(Protocol):
    @property
    def init_containers(self) -> Sequence[_Named]: ...

    @property
    def containers(self) -> Sequence[_Named]: ...


class PodLike(Protocol):
    """What choosing a pending pod reads: the shared ``Pod`` of a watch cache and :class:`PendingPod` both are."""

    @property
    def metadata(self) -> ObjectMeta: ...

    @property
    def spec(self) -> _SpecLike: ...

    @property
    def status(self) -> PodStatus: ...


def _bind_time(pod: PodLike) -> int:
    try:
        return int(pod.metadata.annotations.get(BIND_TIME, ""))
    except ValueError:
        return 0


def _is_candidate(pod: PodLike, node: str, gone: Container[str]) -> bool:
    ann = pod.metadata.annotations
    return (
        pod.status.phase == PENDING
        and BIND_TIME in ann
        and ann.get(BIND_PHASE) in _PHASES
        and ann.get(VGPU_NODE) == node
        and pod.metadata.uid not in gone
        and pod.metadata.deletion_timestamp is None
    )


def _priority(c: PendingContainer, resource: str) -> int | None:
    text = c.resources.limits.get(resource)
    if text is None:
        return None
    with contextlib.suppress(ValueError, ArithmeticError):
        return as_int(text)
    return None


def pod_grant(pod: PendingPod, priority_name: str = GPU_PRIORITY) -> PodGrant:
    """Pair the pod's to-allocate list and MIG reservations with its containers, init containers first
    (raises BrokenPod).

    ``priority_name`` is the device config's resourcePriorityName: a renamed priority still reaches the pod.
    """
    meta = pod.metadata
    containers: Sequence[PendingContainer] = (*pod.spec.init_containers, *pod.spec.containers)
    try:
        devices = decode_pod_devices(meta.annotations.get(DEVICES_TO_ALLOCATE, ""))
        mig_value = meta.annotations.get(MIG_ALLOCATIONS)
        mig = decode_mig_allocations(mig_value) if mig_value is not None else ()
        return from_annotation(
            pod_uid=meta.uid,
            namespace=meta.namespace,
            name=meta.name,
            container_names=[c.name for c in containers],
            devices=devices,
            priorities={c.name: p for c in containers if (p := _priority(c, priority_name)) is not None},
            disable_control={
                c.name
                for c in containers
                if any(e.name == envvars.CUDA_DISABLE_CONTROL and is_true(e.value) for e in c.env)
            },
            mig=mig,
        )
    except (AnnotationError, InvalidInput) as err:
        raise BrokenPod(pod, str(err)) from err


def next_pending(
    pods: Sequence[PendingPod],
    node: str,
    device_count: int,
    *,
    inflight: Mapping[str, Collection[str]] | None = None,
    gone: Container[str] = (),
    key: GrantKey | None = None,
    priority_name: str = GPU_PRIORITY,
) -> PendingAllocation:
    """The container of the oldest pending pod whose next unserved entry asks for ``device_count`` devices.

    Raises :class:`NotFound` (HAMi's ``no binding pod found on node <n>``, or no pod wanting that many
    devices, or none whose grant the scheduler signed with ``key``) and :class:`BrokenPod` when the oldest
    signed candidate's device list is malformed.
    """
    served = inflight or {}
    candidates = sorted((p for p in pods if _is_candidate(p, node, gone)), key=_bind_time)
    if not candidates:
        raise NotFound(f"no binding pod found on node {node}")
    wanted: list[str] = []
    for pod in candidates:
        refused = unverified_reason(key, pod.metadata.uid, pod.metadata.annotations)
        if refused:
            wanted.append(f"{pod.metadata.namespace}/{pod.metadata.name} not served: {refused}")
            continue
        grant = pod_grant(pod, priority_name)
        done = served.get(pod.metadata.uid, ())
        left = [c for c in grant.containers if c.devices and c.name not in done]
        if not left:
            continue
        if len(left[0].devices) != device_count:
            wanted.append(f"{pod.metadata.namespace}/{pod.metadata.name} wants {len(left[0].devices)}")
            continue
        return PendingAllocation(
            pod=pod,
            grant=left[0],
            complete=len(left) == 1,
            trace_context=pod.metadata.annotations.get(TRACE_CONTEXT, ""),
        )
    detail = f" ({'; '.join(wanted)})" if wanted else ""
    raise NotFound(f"no pending device allocation for {device_count} device(s) on node {node}{detail}")


def next_uuids(
    pods: Iterable[PodLike],
    node: str,
    device_count: int,
    *,
    inflight: Mapping[str, Collection[str]] | None = None,
    gone: Container[str] = (),
    key: GrantKey | None = None,
) -> tuple[str, ...]:
    """The GPU UUIDs :func:`next_pending` would grant next, from pods already at hand (a watch cache): what
    GetPreferredAllocation maps onto the kubelet's IDs, as HAMi's does. Empty when none is known; never raises."""
    served = inflight or {}
    for pod in sorted((p for p in pods if _is_candidate(p, node, gone)), key=_bind_time):
        if unverified_reason(key, pod.metadata.uid, pod.metadata.annotations):
            continue
        try:
            devices = decode_pod_devices(pod.metadata.annotations.get(DEVICES_TO_ALLOCATE, ""))
        except AnnotationError:
            continue
        done = served.get(pod.metadata.uid, ())
        names = [c.name for c in (*pod.spec.init_containers, *pod.spec.containers)]
        left = [e for i, e in enumerate(devices) if e and (i >= len(names) or names[i] not in done)]
        if left and len(left[0]) == device_count:
            return tuple(d.uuid for d in left[0])
    return ()
