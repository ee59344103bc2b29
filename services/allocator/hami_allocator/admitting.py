"""Which pod an ``Allocate`` is for, told by the kubelet's PodResources ``List`` instead of guessed.

The device plugin API names device IDs, never a pod; HAMi serves the oldest pending grant on the node to
whoever asks, so a pod the scheduler never placed (bound by hand, or with a request the scheduler read as
no GPU) was handed a waiting pod's grant. The kubelet admits one pod at a time and allocates its containers
in order (init containers first), and its PodResources ``List`` shows every active pod with the device IDs
each listed container already holds: the pod being admitted is the one with a container that asks for this
resource and holds none of it yet. Pure: the caller lists, and gives the pods' specs as its watch holds them.

``List`` leaves out init containers that are not restartable, so a pod whose only GPU containers are such
init containers can never show a container waiting; it is taken only when no other pod waits and no init
container of it has started yet.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError

from hami_common.errors import NotFound, TransientError
from hami_common.kube import ObjectMeta, PodStatus, ResourceRequirements
from hami_common.podresources import ListedPod
from hami_common.quantity import as_int

__all__ = ["Admitting", "KubeletPods", "SpecPod", "admitting", "ask_kubelet"]

KubeletPods = Callable[[], Awaitable[Sequence[ListedPod]]]  # the kubelet's PodResources List


class _Container(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def resources(self) -> ResourceRequirements: ...


class _Spec(Protocol):
    @property
    def init_containers(self) -> Sequence[_Container]: ...

    @property
    def containers(self) -> Sequence[_Container]: ...


class SpecPod(Protocol):
    @property
    def metadata(self) -> ObjectMeta: ...

    @property
    def spec(self) -> _Spec: ...

    @property
    def status(self) -> PodStatus: ...


@dataclass(frozen=True, slots=True)
class Admitting:
    """The pod the kubelet is admitting, and its containers that ask for the resource and hold none yet."""

    uid: str
    namespace: str
    name: str
    waiting: frozenset[str]

    @property
    def what(self) -> str:
        return f"{self.namespace}/{self.name}"


def _asks(container: _Container, resource: str) -> bool:
    """Whether the container asks for ``resource``; a value that cannot be read counts as asking."""
    text = container.resources.limits.get(resource, container.resources.requests.get(resource))
    if text is None:
        return False
    with contextlib.suppress(ValueError, ArithmeticError):
        return as_int(text) != 0
    return True


def _waiting(listed: ListedPod, pod: SpecPod, resource: str) -> tuple[frozenset[str], frozenset[str]]:
    """(listed containers that ask and hold nothing, unlisted init containers that ask)."""
    held = {c.name: c.devices.get(resource, ()) for c in listed.containers}
    waiting, unlisted = set(), set()
    for container in (*pod.spec.init_containers, *pod.spec.containers):
        if not _asks(container, resource):
            continue
        if container.name not in held:
            unlisted.add(container.name)
        elif not held[container.name]:
            waiting.add(container.name)
    return frozenset(waiting), frozenset(unlisted)


def admitting(
    listed: Sequence[ListedPod], pods: Mapping[tuple[str, str], SpecPod], resource: str, node: str
) -> Admitting:
    """The pod the kubelet's ``Allocate`` of ``resource`` is for; :class:`NotFound` naming why when it cannot
    be told (no pod waits, or several do). ``pods`` are the node's pods by (namespace, name); a listed pod
    missing there is not judged."""
    clear: list[Admitting] = []
    init_only: list[Admitting] = []
    for entry in listed:
        pod = pods.get((entry.namespace, entry.name))
        if pod is None:
            continue
        waiting, unlisted = _waiting(entry, pod, resource)
        if waiting:
            clear.append(Admitting(pod.metadata.uid, entry.namespace, entry.name, waiting | unlisted))
        elif unlisted and not pod.status.init_container_statuses:
            init_only.append(Admitting(pod.metadata.uid, entry.namespace, entry.name, unlisted))
    found = clear or init_only
    if len(found) == 1:
        return found[0]
    if not found:
        raise NotFound(f"the kubelet on node {node} lists no pod waiting for {resource}: no grant is handed out")
    names = ", ".join(sorted(a.what for a in found))
    raise NotFound(
        f"the kubelet on node {node} lists several pods waiting for {resource} ({names}): "
        "which one this Allocate is for cannot be told, no grant is handed out"
    )


async def ask_kubelet(kubelet_pods: KubeletPods, within: float) -> Sequence[ListedPod]:
    """The kubelet's List, or :class:`TransientError` (UNAVAILABLE to the kubelet) when it does not answer."""
    try:
        async with asyncio.timeout(within):
            return await kubelet_pods()
    except (grpc.aio.AioRpcError, DecodeError, OSError, TimeoutError) as err:
        detail = err.details() if isinstance(err, grpc.aio.AioRpcError) else (str(err) or "timed out")
        raise TransientError(f"cannot ask the kubelet which pod this Allocate is for: {detail}") from err
