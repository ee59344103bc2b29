"""The web page's view models: the cluster state, turned into what each view shows, by pure functions.

The page (``/ui/``) has HAMi-WebUI's views (Overview, Nodes, Cards, Workloads, and Quotas); each list and each
detail page is one function here, from a :class:`~hami_metrics.state.ClusterState` snapshot (and ``now_ns``,
passed in) to a ``msgspec.Struct`` the route encodes as JSON. Nothing here reads a clock or does I/O.

"No data" is ``None``, never ``0``: a card without a device sample has no *used* memory figure, a pod whose
interposer has not reported has no usage, and the page says so rather than drawing a zero (HAMi-WebUI's
users read its zeros as "idle" when they meant "unknown").

Booked figures are what the placements grant (HAMi's scheduler cache, collapsed per pod and card as
:func:`hami_metrics.podusage.collapse` does); used figures are the node agent's device samples (per card) and
the interposer's usage reports (per container).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Final

import msgspec

from hami_common.events import FilterRefusal
from hami_metrics.state import NS_PER_S, ClusterState, ContainerUsage, Device, NodeState, PodOnNode

__all__ = [
    "CardDetail",
    "CardRow",
    "Holder",
    "ModelRow",
    "NodeDetail",
    "NodeRow",
    "Overview",
    "QuotaRow",
    "WorkloadDetail",
    "WorkloadRow",
    "card_detail",
    "cards",
    "find_card",
    "node_detail",
    "nodes",
    "overview",
    "quotas",
    "vendor_of",
    "workload_detail",
    "workloads",
]

MIB: Final = 1 << 20
STATE_BOUND: Final = "bound"
STATE_PENDING: Final = "pending"
_VENDOR_WORD: Final = re.compile(r"[A-Za-z]+")


def vendor_of(device_type: str) -> str:
    """The vendor word of a registered type: ``NVIDIA-A100`` → NVIDIA, ``DCU-K100_AI`` → DCU, ``MLU370`` →
    MLU, ``Ascend910B3`` → Ascend (the node agents' types, hami-vendors §0)."""
    head = device_type.split("-", 1)[0]
    found = _VENDOR_WORD.match(head)
    return found.group(0) if found else (head or "unknown")


# --- wire types -------------------------------------------------------------------------------------------


class Holder(msgspec.Struct, frozen=True, kw_only=True):
    """A pod's booking on one card."""

    uid: str
    namespace: str
    name: str
    memory_mib: int
    cores: int


class MigRow(msgspec.Struct, frozen=True, kw_only=True):
    profile: str
    start: int
    size: int
    pod_uid: str
    pod: str  # namespace/name
    mig_uuid: str | None  # None until the device plugin has created the instance


class CardRow(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    uuid: str
    index: int
    vendor: str
    model: str
    health: bool
    memory_mib: int
    memory_booked_mib: int
    memory_used_mib: int | None  # None: no device sample from the node agent
    cores: int
    cores_booked: int
    utilization_percent: int | None  # None: no device sample
    slices: int
    slices_booked: int
    pods: list[str]  # uids of the pods holding it, sorted by namespace/name


class CardDetail(msgspec.Struct, frozen=True, kw_only=True):
    card: CardRow
    holders: list[Holder]
    mig: list[MigRow]


class ModelRow(msgspec.Struct, frozen=True, kw_only=True):
    """The cluster's cards of one vendor and model, summed."""

    vendor: str
    model: str
    cards: int
    memory_mib: int
    memory_booked_mib: int
    memory_used_mib: int | None  # None: no card of this model has a device sample
    cores: int
    cores_booked: int


class Overview(msgspec.Struct, frozen=True, kw_only=True):
    nodes: int
    cards: int
    pods_bound: int
    pods_pending: int
    memory_mib: int
    memory_booked_mib: int
    memory_used_mib: int | None
    cores: int
    cores_booked: int
    utilization_percent: float | None  # the mean over cards with a sample
    cards_reporting: int  # cards with a device sample: the used figures cover these
    models: list[ModelRow]


class NodeRow(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    vendors: list[str]
    cards: int
    memory_mib: int
    memory_booked_mib: int
    memory_used_mib: int | None
    cores: int
    cores_booked: int
    pods: int
    last_seen_s: float  # seconds since the node last reported


class Grant(msgspec.Struct, frozen=True, kw_only=True):
    """What a pod was granted on one card (collapsed over its containers)."""

    uuid: str
    model: str | None  # None: the card is not in the node's inventory (yet)
    memory_mib: int
    cores: int


class ContainerUse(msgspec.Struct, frozen=True, kw_only=True):
    """One container's use of one card, as its interposer reported it."""

    container: str
    uuid: str
    used_mib: float
    limit_mib: float
    sm_util_percent: int
    seen_s: float  # seconds since the report


class WorkloadRow(msgspec.Struct, frozen=True, kw_only=True):
    uid: str  # a pending pod admitted before it had a uid: <namespace>_<name> (schedpath.pending_key)
    namespace: str
    name: str
    state: str  # "bound" or "pending"
    node: str  # "" while pending
    cards: list[str]  # uuids
    memory_booked_mib: int
    cores_booked: int
    memory_used_mib: float | None  # None: no usage report (yet) from the interposer
    sm_util_percent: int | None
    reason: str  # why a pending pod waits; "" once bound
    waiting_s: float | None  # a pending pod: since its admission


class WorkloadDetail(msgspec.Struct, frozen=True, kw_only=True):
    pod: WorkloadRow
    grants: list[Grant]
    usage: list[ContainerUse]
    containers: list[str]
    mig: list[MigRow]
    path: list[str]  # the scheduling path as the bus saw it, one line a step


class NodeDetail(msgspec.Struct, frozen=True, kw_only=True):
    node: NodeRow
    cards: list[CardRow]
    pods: list[WorkloadRow]


class QuotaRow(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    resource: str
    used: int
    limit: int | None  # None: no ResourceQuota limit on it
    percent: float | None


# --- helpers ---------------------------------------------------------------------------------------------


def _seconds(ns: int) -> float:
    return round(max(ns, 0) / NS_PER_S, 1)


def _booked(node: NodeState) -> dict[str, list[tuple[PodOnNode, int, int, int]]]:
    """Per card uuid: (pod, MiB, cores, slots) of every pod placed on it."""
    out: dict[str, list[tuple[PodOnNode, int, int, int]]] = {}
    for pod in node.pods.values():
        for d in pod.devices:
            out.setdefault(d.uuid, []).append((pod, d.usedmem_mib, d.usedcores, d.slots))
    return out


def _card_row(node: NodeState, dev: Device, held: list[tuple[PodOnNode, int, int, int]]) -> CardRow:
    host = node.host.get(dev.uuid)
    ordered = sorted(held, key=lambda h: (h[0].namespace, h[0].name))
    return CardRow(
        node=node.name,
        uuid=dev.uuid,
        index=dev.index,
        vendor=vendor_of(dev.type),
        model=dev.type,
        health=dev.health,
        memory_mib=dev.devmem_mib,
        memory_booked_mib=sum(h[1] for h in held),
        memory_used_mib=None if host is None else host.memory_used_bytes // MIB,
        cores=dev.devcore,
        cores_booked=sum(h[2] for h in held),
        utilization_percent=None if host is None else host.utilization_percent,
        slices=dev.count,
        slices_booked=sum(h[3] for h in held),
        pods=[h[0].uid for h in ordered],
    )


def _node_cards(node: NodeState) -> list[CardRow]:
    booked = _booked(node)
    return [_card_row(node, dev, booked.get(dev.uuid, [])) for dev in sorted(node.devices, key=lambda d: d.index)]


def _sorted_nodes(state: ClusterState) -> list[NodeState]:
    return sorted(state.nodes.values(), key=lambda n: n.name)


def _sum_known(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _pod_usage(node: NodeState, uid: str) -> list[ContainerUsage]:
    return sorted((u for key, u in node.usage.items() if key[0] == uid), key=lambda u: (u.container, u.device_uuid))


def _bound_row(node: NodeState, pod: PodOnNode, used: list[ContainerUsage]) -> WorkloadRow:
    return WorkloadRow(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        state=STATE_BOUND,
        node=node.name,
        cards=[d.uuid for d in pod.devices],
        memory_booked_mib=sum(d.usedmem_mib for d in pod.devices),
        cores_booked=sum(d.usedcores for d in pod.devices),
        memory_used_mib=round(sum(u.used_bytes for u in used) / MIB, 1) if used else None,
        sm_util_percent=max(u.sm_util_percent for u in used) if used else None,
        reason="",
        waiting_s=None,
    )


def _pending_reason(waiting_s: float, refusal: FilterRefusal | None, now_ns: int) -> str:
    """The extender's latest reasons (``hami.scheduling``) when it has refused the pod, else what the bus knows."""
    admitted = f"admitted by the webhook {waiting_s:g} s ago and not placed yet"
    if refusal is None:
        return (
            f"{admitted}: the filter has not refused it (kube-scheduler may not have asked yet); the pod's "
            "FailedScheduling events give kube-scheduler's own reasons"
        )
    reasons = ", ".join(f"{r.nodes} {r.reason}" for r in refusal.reasons) or "no reason given"
    ago = _seconds(now_ns - refusal.at_ns)
    return f"{admitted}: no node fits ({refusal.nodes} nodes offered: {reasons}; {ago:g} s ago)"


def _pending_rows(state: ClusterState, now_ns: int) -> Iterator[WorkloadRow]:
    for uid, p in state.path.pending_admissions.items():
        waiting = _seconds(now_ns - p.at_ns)
        yield WorkloadRow(
            uid=uid,
            namespace=p.namespace,
            name=p.name,
            state=STATE_PENDING,
            node="",
            cards=[],
            memory_booked_mib=0,
            cores_booked=0,
            memory_used_mib=None,
            sm_util_percent=None,
            reason=_pending_reason(waiting, p.refusal, now_ns),
            waiting_s=waiting,
        )


def _by_usage(node: NodeState) -> dict[str, list[ContainerUsage]]:
    out: dict[str, list[ContainerUsage]] = {}
    for key, u in node.usage.items():
        out.setdefault(key[0], []).append(u)
    return out


def _node_workloads(node: NodeState) -> list[WorkloadRow]:
    usage = _by_usage(node)
    return [_bound_row(node, pod, usage.get(uid, [])) for uid, pod in node.pods.items()]


def _node_row(node: NodeState, cards: list[CardRow], now_ns: int) -> NodeRow:
    return NodeRow(
        name=node.name,
        vendors=sorted({c.vendor for c in cards}),
        cards=len(cards),
        memory_mib=sum(c.memory_mib for c in cards),
        memory_booked_mib=sum(c.memory_booked_mib for c in cards),
        memory_used_mib=_sum_known(c.memory_used_mib for c in cards),
        cores=sum(c.cores for c in cards),
        cores_booked=sum(c.cores_booked for c in cards),
        pods=len(node.pods),
        last_seen_s=_seconds(now_ns - node.last_seen_ns),
    )


def _mig_rows(pod: PodOnNode, gpu_uuid: str | None = None) -> list[MigRow]:
    return [
        MigRow(
            profile=m.profile,
            start=m.placement.start,
            size=m.placement.size,
            pod_uid=pod.uid,
            pod=f"{pod.namespace}/{pod.name}",
            mig_uuid=m.mig_uuid or None,
        )
        for m in pod.mig
        if gpu_uuid is None or m.gpu_uuid == gpu_uuid
    ]


# --- the views -------------------------------------------------------------------------------------------


def cards(state: ClusterState) -> list[CardRow]:
    """Every registered card, by node name then index."""
    return [row for node in _sorted_nodes(state) for row in _node_cards(node)]


def overview(state: ClusterState) -> Overview:
    rows = cards(state)
    models: dict[tuple[str, str], list[CardRow]] = {}
    for row in rows:
        models.setdefault((row.vendor, row.model), []).append(row)
    sampled = [r.utilization_percent for r in rows if r.utilization_percent is not None]
    return Overview(
        nodes=len(state.nodes),
        cards=len(rows),
        pods_bound=sum(len(n.pods) for n in state.nodes.values()),
        pods_pending=len(state.path.pending_admissions),
        memory_mib=sum(r.memory_mib for r in rows),
        memory_booked_mib=sum(r.memory_booked_mib for r in rows),
        memory_used_mib=_sum_known(r.memory_used_mib for r in rows),
        cores=sum(r.cores for r in rows),
        cores_booked=sum(r.cores_booked for r in rows),
        utilization_percent=round(sum(sampled) / len(sampled), 1) if sampled else None,
        cards_reporting=len(sampled),
        models=[
            ModelRow(
                vendor=vendor,
                model=model,
                cards=len(group),
                memory_mib=sum(r.memory_mib for r in group),
                memory_booked_mib=sum(r.memory_booked_mib for r in group),
                memory_used_mib=_sum_known(r.memory_used_mib for r in group),
                cores=sum(r.cores for r in group),
                cores_booked=sum(r.cores_booked for r in group),
            )
            for (vendor, model), group in sorted(models.items())
        ],
    )


def nodes(state: ClusterState, now_ns: int) -> list[NodeRow]:
    return [_node_row(node, _node_cards(node), now_ns) for node in _sorted_nodes(state)]


def node_detail(state: ClusterState, name: str, now_ns: int) -> NodeDetail | None:
    node = state.nodes.get(name)
    if node is None:
        return None
    rows = _node_cards(node)
    pods = sorted(_node_workloads(node), key=lambda w: (w.namespace, w.name))
    return NodeDetail(node=_node_row(node, rows, now_ns), cards=rows, pods=pods)


def find_card(state: ClusterState, uuid: str) -> tuple[NodeState, Device] | None:
    for node in state.nodes.values():
        for dev in node.devices:
            if dev.uuid == uuid:
                return node, dev
    return None


def card_detail(state: ClusterState, uuid: str) -> CardDetail | None:
    found = find_card(state, uuid)
    if found is None:
        return None
    node, dev = found
    held = _booked(node).get(uuid, [])
    holders = sorted(
        (Holder(uid=p.uid, namespace=p.namespace, name=p.name, memory_mib=m, cores=c) for p, m, c, _ in held),
        key=lambda h: (h.namespace, h.name),
    )
    mig = sorted((row for pod in node.pods.values() for row in _mig_rows(pod, uuid)), key=lambda r: (r.start, r.pod))
    return CardDetail(card=_card_row(node, dev, held), holders=holders, mig=mig)


def workloads(state: ClusterState, now_ns: int) -> list[WorkloadRow]:
    """Every pod placed on a node, then every admitted GPU pod still waiting; by namespace and name."""
    bound = [row for node in state.nodes.values() for row in _node_workloads(node)]
    return sorted(bound, key=lambda w: (w.namespace, w.name)) + sorted(
        _pending_rows(state, now_ns), key=lambda w: (w.namespace, w.name, w.uid)
    )


def _path_lines(pod: PodOnNode, node: NodeState, used: list[ContainerUsage], now_ns: int) -> list[str]:
    lines = [f"placed on {node.name} by the extender {_seconds(now_ns - pod.bind_time_ns):g} s ago"]
    pending_mig = [m for m in pod.mig if not m.realised]
    if pod.mig:
        done = len(pod.mig) - len(pending_mig)
        lines.append(f"MIG instances created by the device plugin: {done}/{len(pod.mig)}")
    if used:
        newest = max(u.seen_ns for u in used)
        lines.append(f"the interposer reports its use ({_seconds(now_ns - newest):g} s ago)")
    else:
        lines.append("no usage report from the interposer yet (the container has not started CUDA, or is not running)")
    return lines


def workload_detail(state: ClusterState, uid: str, now_ns: int) -> WorkloadDetail | None:
    for node in state.nodes.values():
        pod = node.pods.get(uid)
        if pod is None:
            continue
        used = _pod_usage(node, uid)
        models = {d.uuid: d.type for d in node.devices}
        return WorkloadDetail(
            pod=_bound_row(node, pod, used),
            grants=[
                Grant(uuid=d.uuid, model=models.get(d.uuid), memory_mib=d.usedmem_mib, cores=d.usedcores)
                for d in pod.devices
            ],
            usage=[
                ContainerUse(
                    container=u.container,
                    uuid=u.device_uuid,
                    used_mib=round(u.used_bytes / MIB, 1),
                    limit_mib=round(u.limit_bytes / MIB, 1),
                    sm_util_percent=u.sm_util_percent,
                    seen_s=_seconds(now_ns - u.seen_ns),
                )
                for u in used
            ],
            containers=list(pod.containers),
            mig=_mig_rows(pod),
            path=_path_lines(pod, node, used, now_ns),
        )
    for row in _pending_rows(state, now_ns):
        if row.uid == uid:
            path = ["admitted by the webhook (a GPU pod, routed to hami-scheduler)", f"waiting: {row.reason}"]
            return WorkloadDetail(pod=row, grants=[], usage=[], containers=[], mig=[], path=path)
    return None


def quotas(state: ClusterState) -> list[QuotaRow]:
    return [
        QuotaRow(
            namespace=namespace,
            resource=r.name,
            used=r.used,
            limit=r.limit,
            percent=round(100 * r.used / r.limit, 1) if r.limit else None,
        )
        for namespace, resources in sorted(state.quotas.items())
        for r in sorted(resources, key=lambda r: r.name)
    ]
