"""Other vendors' device plugins, for declared (fake) devices: one kubelet socket per resource they serve.

Each configured family with devices in the fake inventory gets, per resource its plugin serves (Ascend's
``huawei.com/<CommonWord>``, Hygon's ``hygon.com/dcunum``, Cambricon's ``…smlu.vcore`` and ``…smlu.vmemory``),
a :class:`VendorPluginService` on its own socket, registered with the kubelet separately, as those plugins
are. ``Allocate`` works as theirs do, synchronously: list the node's pods, let the family's pure answer
(:meth:`hami_common.vendors.plugin.VendorPlugin.allocate`) pick the pod and build the reply, write its host
files, patch the pod (erased entry, flags) and, where the plugin does, settle ``hami.io/bind-phase`` and
release the node lock. The loop never names a vendor. In production the vendors' own plugins run instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from hami_allocator.admitting import Admitting, KubeletPods, admitting, ask_kubelet
from hami_allocator.followup import release_node_lock
from hami_allocator.pending import NodePods, PendingPod
from hami_allocator.plugin import _abort, to_pb
from hami_common import logkeys
from hami_common.annotations import BIND_PHASE, BIND_PHASE_SUCCESS, DEVICES_TO_ALLOCATE
from hami_common.annotations.devices import decode_pod_devices
from hami_common.deviceplugin.rpc import HEALTHY, UNHEALTHY, DevicePluginServicer, pb
from hami_common.errors import AnnotationError, HamiError, InvalidInput, NotFound, TransientError
from hami_common.inventory import Gpu
from hami_common.kube import NodePatcher, PodPatcher
from hami_common.resources import ContainerResources
from hami_common.vendors.plugin import AllocateCall, PendingView, PluginAnswer, VendorPlugin

__all__ = ["VendorNode", "VendorPluginService", "erase_keys", "pending_view", "settled"]

log = logging.getLogger(__name__)

_LIST_TIMEOUT_S: Final = 10.0


def pending_view(pod: PendingPod) -> PendingView:
    meta = pod.metadata
    return PendingView(
        uid=meta.uid,
        namespace=meta.namespace,
        name=meta.name,
        phase=pod.status.phase,
        annotations=meta.annotations,
        containers=tuple(
            ContainerResources(name=c.name, limits=c.resources.limits, requests=c.resources.requests)
            for c in (*pod.spec.init_containers, *pod.spec.containers)
        ),
        deleting=meta.deletion_timestamp is not None,
    )


def settled(annotations: Mapping[str, str], keys: Sequence[str]) -> bool:
    """No device entry is left in any of the to-allocate lists (HAMi's "no vendor word remains")."""
    for key in keys:
        value = annotations.get(key)
        if not value:
            continue
        try:
            if any(decode_pod_devices(value, key)):
                return False
        except AnnotationError:
            return False
    return True


class Patcher(PodPatcher, NodePatcher, Protocol):
    pass


@dataclass(eq=False)
class VendorNode:
    """What one family's plugin shares across its resources on this node: its devices, the pods, one lock."""

    node: str
    plugin: VendorPlugin
    gpus: tuple[Gpu, ...]
    pods: NodePods | None
    kube: Patcher | None
    erase_keys: tuple[str, ...]  # every to-allocate list whose entries count for bind-phase success
    host_root: Path = Path("/")
    hook_path: str = "/usr/local"
    served: dict[str, frozenset[str]] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # the kubelet's PodResources List: only the pod being admitted is served (None: guessed, as HAMi does)
    kubelet_pods: KubeletPods | None = None

    def devices(self, resource: str) -> list[tuple[str, bool]]:
        """The resource's device IDs with the health of the device each belongs to."""
        found: list[tuple[str, bool]] = []
        for gpu in self.gpus:
            found.extend((i, gpu.healthy) for i in self.plugin.advertised(self.node, (gpu,)).get(resource, ()))
        return found

    async def allocate(self, resource: str, ids: Sequence[str]) -> PluginAnswer:
        if self.pods is None:
            raise NotFound(f"{resource}: the plugin needs the apiserver to find its pod")
        async with self.lock:
            try:
                async with asyncio.timeout(_LIST_TIMEOUT_S):
                    listed = await self.pods.list_node_pods(self.node)
            except TimeoutError as err:
                raise TransientError(f"listing the pods of node {self.node} timed out") from err
            if self.kubelet_pods is not None:
                who = await self._admitting(resource, listed)
                listed = [p for p in listed if p.metadata.uid == who.uid]
            call = AllocateCall(
                node=self.node,
                resource=resource,
                device_ids=tuple(ids),
                pods=[pending_view(p) for p in listed],
                gpus=self.gpus,
                served=self.served,
                hook_path=self.hook_path,
            )
            answer = self.plugin.allocate(call)
            self._write_files(answer)
            uid = answer.pod.uid
            self.served[uid] = self.served.get(uid, frozenset()) | {resource}
            await self._record(answer)
        return answer

    async def _admitting(self, resource: str, listed: Sequence[PendingPod]) -> Admitting:
        assert self.kubelet_pods is not None
        running = await ask_kubelet(self.kubelet_pods, _LIST_TIMEOUT_S)
        return admitting(running, {(p.metadata.namespace, p.metadata.name): p for p in listed}, resource, self.node)

    def _write_files(self, answer: PluginAnswer) -> None:
        for file in answer.files:
            path = self.host_root / file.path.lstrip("/")
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(file.text)
            except OSError as err:
                raise TransientError(f"cannot write {path}: {err}") from err

    async def _record(self, answer: PluginAnswer) -> None:
        if self.kube is None:
            return
        pod = answer.pod
        changes: dict[str, str | None] = dict(answer.pod_changes)
        done = answer.settles_bind and settled({**pod.annotations, **answer.pod_changes}, self.erase_keys)
        if done:
            changes[BIND_PHASE] = BIND_PHASE_SUCCESS
        if changes:
            await self.kube.patch_pod_annotations(pod.namespace, pod.name, changes)
        if done:
            await release_node_lock(self.kube, self.node, pod.namespace, pod.name)
        if answer.release_node_annotation is not None:
            await self.kube.patch_node_annotations(self.node, {answer.release_node_annotation: None})
        log.info(
            "allocated %s/%s container %s (%s)",
            pod.namespace,
            pod.name,
            answer.container,
            self.plugin.family.word,
            extra={logkeys.POD_UID: pod.uid},
        )


class VendorPluginService(DevicePluginServicer):  # type: ignore[misc]
    """``v1beta1.DevicePlugin`` for one resource of one family."""

    def __init__(self, node: VendorNode, resource: str) -> None:
        self.vendor = node
        self.resource = resource

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:  # noqa: N802
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    async def ListAndWatch(self, request: pb.Empty, context: Any) -> AsyncIterator[pb.ListAndWatchResponse]:  # noqa: N802
        devices = [
            pb.Device(ID=i, health=HEALTHY if healthy else UNHEALTHY)
            for i, healthy in self.vendor.devices(self.resource)
        ]
        yield pb.ListAndWatchResponse(devices=devices)
        await asyncio.Event().wait()  # declared devices do not change while the plugin runs

    async def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        return pb.PreferredAllocationResponse()

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:  # noqa: N802
        try:
            if not request.container_requests:
                raise InvalidInput("the request holds no container requests")
            answers = []
            for creq in request.container_requests:
                answer = await self.vendor.allocate(self.resource, list(creq.devices_ids))
                answers.append(to_pb(answer.response))
            return pb.AllocateResponse(container_responses=answers)
        except HamiError as err:
            await _abort(context, "Allocate", err)

    async def PreStartContainer(  # noqa: N802
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def erase_keys(plugins: Sequence[VendorPlugin]) -> tuple[str, ...]:
    """The primary family's list (this plugin's own) and every plugin's that erases its entries."""
    return (DEVICES_TO_ALLOCATE, *(k for p in plugins if (k := p.to_allocate_key) is not None))
