"""The aggregator's picture of the cluster, folded from bus events by pure functions.

``apply(state, event, now_ns)`` returns a new :class:`ClusterState`; ``hami_metrics.staleness.expire``
drops what has gone quiet. Nothing here reads a clock, the environment or the network: ``now_ns`` is the
aggregator's receipt time, passed in. Values are frozen and their mappings are never changed after they
are built (copy on write, one level per touched node), so a scrape can render one state in a worker
thread while newer states are being folded.

Where the series come from:

* devices (``hami_gpu_*``, ``hami_node_gpu_*``): the node's :class:`NodeInventory`, with usage summed from
  the placements on that node, each pod collapsed per GPU as HAMi's cache does (hami-protocol §4.9);
* per-pod allocations (``hami_vgpu_*_allocated_*``): :class:`PlacementDecision`;
* per-container usage (``hami_vgpu_memory_*``, ``hami_container_*``): usage reports;
  host GPU figures (``hami_host_gpu_*``): device samples.

A node is alive while its node agent or allocator reports (inventory, usage, device samples, pod ends,
rosters, allocation results). A node silent for ``node_staleness`` disappears with every series it carried.
A container's usage silent for ``usage_staleness`` disappears on its own. A pod's series disappear when
its :class:`PodEnded` arrives, or when the node's :class:`NodePods` roster no longer lists it; its uid is
remembered for ``node_staleness`` so that a late sample does not bring it back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, TypeAlias

from hami_common.annotations import DeviceInfo, MigAllocation
from hami_common.events import (
    AdmissionEvent,
    AllocationResult,
    DeviceSample,
    FilterRefusal,
    NodeInventory,
    NodePods,
    PlacementDecision,
    PodEnded,
    QuotaResource,
    QuotaUsage,
    UsageSample,
)
from hami_metrics.nodemap import NodeMap
from hami_metrics.podusage import PodDevice, collapse
from hami_metrics.schedpath import (
    KIND_INVENTORY,
    KIND_USAGE,
    NS_PER_S,
    PathStats,
    on_admission,
    on_allocation,
    on_placement,
    on_refusal,
    with_lag,
)

__all__ = [
    "NS_PER_S",
    "ClusterState",
    "ContainerUsage",
    "Device",
    "Event",
    "HostDevice",
    "NodeState",
    "PathStats",
    "PodOnNode",
    "UsageKey",
    "apply",
]


UUID_LABEL_CHARS: Final = 40  # the monitor labels a device by the first 40 characters of its UUID
COLLAPSED_CONTAINER_INDEX: Final = "0"  # the scheduler cache holds one collapsed entry per pod

Event: TypeAlias = (
    AdmissionEvent
    | PlacementDecision
    | AllocationResult
    | NodeInventory
    | UsageSample
    | DeviceSample
    | PodEnded
    | NodePods
    | QuotaUsage
    | FilterRefusal
)
UsageKey: TypeAlias = tuple[str, str, str]  # pod uid, container name, device uuid


@dataclass(frozen=True, slots=True)
class Device:
    """One registered GPU (``hami.io/node-nvidia-register`` entry, as the inventory carries it)."""

    uuid: str
    index: int
    type: str
    count: int
    devmem_mib: int
    devcore: int
    health: bool

    @classmethod
    def from_info(cls, info: DeviceInfo) -> Device:
        return cls(
            uuid=info.id,
            index=info.index,
            type=info.type,
            count=info.count,
            devmem_mib=info.devmem,
            devcore=info.devcore,
            health=info.health,
        )


@dataclass(frozen=True, slots=True)
class PodOnNode:
    uid: str
    namespace: str
    name: str
    devices: tuple[PodDevice, ...]  # collapsed, sorted by uuid
    ordinals: Mapping[tuple[str, str], int]  # (container, device uuid) -> the device's index in the container
    bind_time_ns: int
    containers: tuple[str, ...] = ()  # container names in the placement's order, which MIG indices follow
    # MIG reservations: runtime ids once the allocator reports them or the node agent's roster carries them
    mig: tuple[MigAllocation, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    pod_uid: str
    namespace: str
    pod: str
    container: str
    device_uuid: str
    vdevice_index: int
    used_bytes: int
    limit_bytes: int
    sm_util_percent: int
    context_bytes: int | None
    module_bytes: int | None
    buffer_bytes: int | None
    last_kernel_at_s: int | None
    seen_ns: int
    # The monitor's label values (namespace, pod, container, vdevice index, uuid's first 40 characters),
    # carried from sample to sample so a scrape meets the same tuple and can reuse what it rendered.
    series: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HostDevice:
    node: str
    uuid: str
    index: int
    name: str
    memory_used_bytes: int
    utilization_percent: int
    memory_utilization_percent: int
    seen_ns: int


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    last_seen_ns: int
    devices: tuple[Device, ...] = ()
    pods: Mapping[str, PodOnNode] = field(default_factory=dict)
    usage: Mapping[UsageKey, ContainerUsage] = field(default_factory=dict)
    host: Mapping[str, HostDevice] = field(default_factory=dict)
    ended: Mapping[str, int] = field(default_factory=dict)  # pod uid -> when its end was seen


@dataclass(frozen=True, slots=True)
class ClusterState:
    nodes: NodeMap[NodeState] = field(default_factory=NodeMap)
    path: PathStats = field(default_factory=PathStats)
    nodes_expired: int = 0
    applied: int = 0
    # namespace -> its GPU quota resources, as the webhook's latest QuotaUsage snapshot says
    quotas: Mapping[str, tuple[QuotaResource, ...]] = field(default_factory=dict)


# --- folding ------------------------------------------------------------------------------------------


def apply(state: ClusterState, event: Event, now_ns: int) -> ClusterState:
    """The state after ``event`` arrived at ``now_ns``; unknown event types leave it unchanged."""
    match event:
        case UsageSample():
            new = _on_usage(state, event, now_ns)
        case DeviceSample():
            new = _on_device_sample(state, event, now_ns)
        case PodEnded():
            new = _on_pod_ended(state, event, now_ns)
        case NodePods():
            new = _on_node_pods(state, event, now_ns)
        case NodeInventory():
            new = _on_inventory(state, event, now_ns)
        case PlacementDecision():
            new = _on_placement(state, event, now_ns)
        case AllocationResult():
            new = _on_allocation(state, event, now_ns)
        case AdmissionEvent():
            new = _on_admission(state, event, now_ns)
        case QuotaUsage():
            new = _on_quota(state, event)
        case FilterRefusal():
            new = _next(state, on_refusal(state.path, event))
        case _:
            return state
    return new


# Usage samples arrive by the thousand a second: the helpers on their path build frozen values with their
# constructors rather than dataclasses.replace, which is several times slower.


def _seen(state: ClusterState, name: str, now_ns: int) -> NodeState:
    node = state.nodes.get(name)
    return NodeState(name=name, last_seen_ns=now_ns) if node is None else replace(node, last_seen_ns=now_ns)


def _next(state: ClusterState, path: PathStats, nodes: NodeMap[NodeState] | None = None) -> ClusterState:
    """The state after one more event (``applied`` counts it)."""
    return ClusterState(
        state.nodes if nodes is None else nodes, path, state.nodes_expired, state.applied + 1, state.quotas
    )


def _with_node(state: ClusterState, node: NodeState, path: PathStats | None = None) -> ClusterState:
    return _next(state, state.path if path is None else path, state.nodes.set(node.name, node))


def _on_usage(state: ClusterState, ev: UsageSample, now_ns: int) -> ClusterState:
    node = state.nodes.get(ev.node) or NodeState(name=ev.node, last_seen_ns=now_ns)
    path = with_lag(state.path, KIND_USAGE, ev.at_ns, now_ns)
    if ev.pod_uid in node.ended:  # a late sample of a pod already gone: keep it gone
        return _with_node(state, replace(node, last_seen_ns=now_ns), path)
    key = (ev.pod_uid, ev.container, ev.device_uuid)
    extra = ev if isinstance(ev, UsageSample) else None
    previous = node.usage.get(key)
    if extra is not None and extra.vdevice_index is not None:
        vdevice_index = extra.vdevice_index
    elif previous is not None:
        vdevice_index = previous.vdevice_index
    else:
        vdevice_index = _ordinal(node, ev)
    if previous is not None and previous.vdevice_index == vdevice_index:
        series = previous.series
    else:
        series = (ev.namespace, ev.pod, ev.container, str(vdevice_index), ev.device_uuid[:UUID_LABEL_CHARS])
    usage = dict(node.usage)
    usage[key] = ContainerUsage(
        pod_uid=ev.pod_uid,
        namespace=ev.namespace,
        pod=ev.pod,
        container=ev.container,
        device_uuid=ev.device_uuid,
        vdevice_index=vdevice_index,
        used_bytes=ev.used_bytes,
        limit_bytes=ev.limit_bytes,
        sm_util_percent=ev.sm_util_percent,
        context_bytes=extra.context_bytes if extra else None,
        module_bytes=extra.module_bytes if extra else None,
        buffer_bytes=extra.buffer_bytes if extra else None,
        last_kernel_at_s=extra.last_kernel_at_s if extra else None,
        seen_ns=now_ns,
        series=series,
    )
    node = NodeState(node.name, now_ns, node.devices, node.pods, usage, node.host, node.ended)
    return _with_node(state, node, path)


def _ordinal(node: NodeState, ev: UsageSample) -> int:
    """The device's index in its container: from the placement, else the order the devices were first seen."""
    pod = node.pods.get(ev.pod_uid)
    if pod is not None:
        known = pod.ordinals.get((ev.container, ev.device_uuid))
        if known is not None:
            return known
    return sum(1 for (uid, ctr, _) in node.usage if uid == ev.pod_uid and ctr == ev.container)


def _on_device_sample(state: ClusterState, ev: DeviceSample, now_ns: int) -> ClusterState:
    node = _seen(state, ev.node, now_ns)
    host = dict(node.host)
    host[ev.device_uuid] = HostDevice(
        node=ev.node,
        uuid=ev.device_uuid,
        index=ev.index,
        name=ev.name,
        memory_used_bytes=ev.memory_used_bytes,
        utilization_percent=ev.utilization_percent,
        memory_utilization_percent=ev.memory_utilization_percent,
        seen_ns=now_ns,
    )
    return _with_node(state, replace(node, host=host), with_lag(state.path, KIND_USAGE, ev.at_ns, now_ns))


def _on_pod_ended(state: ClusterState, ev: PodEnded, now_ns: int) -> ClusterState:
    node = _seen(state, ev.node, now_ns)
    pods = {uid: pod for uid, pod in node.pods.items() if uid != ev.pod_uid}
    usage = {key: u for key, u in node.usage.items() if key[0] != ev.pod_uid}
    ended = dict(node.ended)
    ended[ev.pod_uid] = now_ns
    node = replace(node, pods=pods, usage=usage, ended=ended)
    return _with_node(state, node, with_lag(state.path, KIND_USAGE, ev.at_ns, now_ns))


def _on_inventory(state: ClusterState, ev: NodeInventory, now_ns: int) -> ClusterState:
    node = replace(_seen(state, ev.node, now_ns), devices=tuple(Device.from_info(d) for d in ev.devices))
    return _with_node(state, node, with_lag(state.path, KIND_INVENTORY, ev.at_ns, now_ns))


def _on_placement(state: ClusterState, ev: PlacementDecision, now_ns: int) -> ClusterState:
    path = on_placement(state.path, ev, now_ns)
    # The extender publishes placements: they do not prove the node alive, so an unknown node starts its
    # staleness clock now and a known one keeps its own.
    node = state.nodes.get(ev.node) or NodeState(name=ev.node, last_seen_ns=now_ns)
    if ev.pod_uid in node.ended:
        return _next(state, path)
    pods = dict(node.pods)
    pods[ev.pod_uid] = _pod(ev)
    return _with_node(state, replace(node, pods=pods), path)


def _pod(ev: PlacementDecision) -> PodOnNode:
    return PodOnNode(
        uid=ev.pod_uid,
        namespace=ev.namespace,
        name=ev.name,
        devices=tuple(
            replace(d, series=(ev.namespace, ev.node, ev.name, COLLAPSED_CONTAINER_INDEX, d.uuid))
            for d in collapse(ev.containers)
        ),
        ordinals={(c.name, d.uuid): i for c in ev.containers for i, d in enumerate(c.devices)},
        bind_time_ns=ev.bind_time_ns,
        containers=tuple(c.name for c in ev.containers),
        mig=tuple(m for c in ev.containers for m in c.mig),
    )


def merge_mig(known: Sequence[MigAllocation], news: Sequence[MigAllocation]) -> tuple[MigAllocation, ...]:
    """``known`` with each reservation replaced by its counterpart in ``news`` (same container and device
    index); a realised entry is never replaced by an unrealised one, whichever message arrives first."""
    fresh = {(m.container_index, m.device_index): m for m in news}
    out = []
    for m in known:
        new = fresh.pop((m.container_index, m.device_index), None)
        out.append(new if new is not None and (new.realised or not m.realised) else m)
    out.extend(fresh.values())
    return tuple(out)


def _on_node_pods(state: ClusterState, ev: NodePods, now_ns: int) -> ClusterState:
    """The node agent's roster is the truth about its node: pods missing from it have ended (a lost
    PodEnded), pods in it are (re)placed (an aggregator that restarted learns what it missed)."""
    node = _seen(state, ev.node, now_ns)
    listed = {p.pod_uid: p for p in ev.pods if p.node == ev.node}
    pods = {}
    for uid, placement in listed.items():
        known = node.pods.get(uid)  # keep the known value while unchanged: its series and cached lines stay
        same = known is not None and known.bind_time_ns == placement.bind_time_ns
        if same and known is not None:
            mig = merge_mig(known.mig, [m for c in placement.containers for m in c.mig])
            pods[uid] = known if mig == known.mig else replace(known, mig=mig)
        else:
            pods[uid] = _pod(placement)
    gone = node.pods.keys() - listed.keys()
    ended = {uid: at for uid, at in node.ended.items() if uid not in listed}
    ended.update((uid, now_ns) for uid in gone)
    usage = {key: u for key, u in node.usage.items() if key[0] not in gone}
    node = replace(node, pods=pods, usage=usage, ended=ended)
    return _with_node(state, node, with_lag(state.path, KIND_USAGE, ev.at_ns, now_ns))


def _on_allocation(state: ClusterState, ev: AllocationResult, now_ns: int) -> ClusterState:
    node = _seen(state, ev.node, now_ns)
    pod = node.pods.get(ev.pod_uid)
    if pod is not None and ev.mig:
        node = replace(node, pods={**node.pods, ev.pod_uid: replace(pod, mig=merge_mig(pod.mig, ev.mig))})
    return _with_node(state, node, on_allocation(state.path, ev, None if pod is None else pod.bind_time_ns, now_ns))


def _on_admission(state: ClusterState, ev: AdmissionEvent, now_ns: int) -> ClusterState:
    return _next(state, on_admission(state.path, ev, now_ns))


def _on_quota(state: ClusterState, ev: QuotaUsage) -> ClusterState:
    """A whole snapshot replaces the namespace's entry; one without resources removes it."""
    quotas = {ns: q for ns, q in state.quotas.items() if ns != ev.namespace}
    if ev.resources:
        quotas[ev.namespace] = ev.resources
    return replace(_next(state, state.path), quotas=quotas)
