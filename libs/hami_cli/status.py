"""``hami status``: the GPU overview of a cluster, the local stack's or any other.

Everything booked comes from the apiserver, the source of truth: the nodes' registration annotation (GPUs,
memory, slices), the pods' ``hami.io/vgpu-devices-allocated`` (who holds what) and the ``FailedScheduling``
Events of pending pods (why they wait). What is *used* comes from the metrics service when it answers (HAMi's
``hami_host_gpu_*`` families); without it those columns say ``-``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from hami_common.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    MIG_ALLOCATIONS,
    NODE_REGISTER,
    ContainerDevice,
    MigAllocation,
    decode_mig_allocations,
    decode_node_devices,
)
from hami_common.annotations.registration import MODE_MIG
from hami_common.errors import AnnotationError
from hami_common.kube import Event, Node, Pod
from hami_common.scheduling.policy import DEFAULT_SCHEDULER_NAME
from hami_metrics.families import HOST_MEMORY_USED, HOST_UTILIZATION
from hami_sim.stack.report import allocated_devices, pending_reasons, render_table, short_uuid

__all__ = ["GpuRow", "MigRow", "Overview", "PodRow", "build_overview", "parse_usage", "render_overview"]

_MIB = 1024 * 1024
_FINISHED = frozenset({"Succeeded", "Failed"})  # their GPUs are free again, as HAMi counts them
WAITING = "waiting to be scheduled"


class MigRow(msgspec.Struct, frozen=True, kw_only=True):
    """One MIG instance booked on a card: its profile and placement, and the device once it exists."""

    profile: str
    start: int
    size: int
    pod: str
    mig_uuid: str = ""  # empty until the device plugin has created the instance


class GpuRow(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    uuid: str
    type: str
    memory_mib: int
    memory_booked_mib: int
    memory_used_mib: int | None  # None: the metrics service did not answer or has no sample yet
    cores_booked: int
    core_utilization: float | None
    slices: int
    slices_booked: int
    pods: list[str]
    mode: str = ""  # "mig" for a card cut into MIG instances
    instances: list[MigRow] = msgspec.field(default_factory=list)


class PodRow(msgspec.Struct, frozen=True, kw_only=True):
    pod: str
    node: str  # "" while pending
    devices: list[str]  # uuid(memMiB,cores%) per granted device
    state: str  # the bind phase once bound, "Pending" before
    reason: str = ""  # why a pending pod waits


class Overview(msgspec.Struct, frozen=True, kw_only=True):
    cluster: str  # the API server's URL
    gpus: list[GpuRow]
    pods: list[PodRow]
    metrics_url: str = ""
    metrics: str = ""  # "ok", or why the used columns are empty


class Usage(msgspec.Struct, frozen=True):
    memory_mib: dict[str, int]  # device uuid -> MiB in use
    utilization: dict[str, float]  # device uuid -> core utilisation, 0-100


def parse_usage(text: str) -> Usage:
    """The per-GPU usage in a Prometheus exposition of the metrics service (unknown families ignored)."""
    memory: dict[str, int] = {}
    util: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            uuid = sample.labels.get("device_uuid", "")
            if not uuid:
                continue
            if sample.name == HOST_MEMORY_USED.name:
                memory[uuid] = int(sample.value) // _MIB
            elif sample.name == HOST_UTILIZATION.name:
                util[uuid] = float(sample.value)
    return Usage(memory, util)


def _is_gpu_pod(pod: Pod) -> bool:
    if pod.status.phase in _FINISHED:
        return False
    if DEVICES_ALLOCATED in pod.metadata.annotations:
        return True
    return not pod.spec.node_name and pod.spec.scheduler_name == DEFAULT_SCHEDULER_NAME


def build_overview(
    cluster: str,
    nodes: Iterable[Node],
    pods: Iterable[Pod],
    events: Iterable[Event],
    usage: Usage | None = None,
    *,
    metrics_url: str = "",
    metrics: str = "",
) -> Overview:
    mine = sorted((p for p in pods if _is_gpu_pod(p)), key=lambda p: (p.metadata.namespace, p.metadata.name))
    reasons = pending_reasons(events)
    holders: dict[str, list[tuple[str, ContainerDevice]]] = {}
    instances: dict[str, list[MigRow]] = {}
    rows = []
    for pod in mine:
        name = f"{pod.metadata.namespace}/{pod.metadata.name}"
        granted = [dev for container in allocated_devices(pod) for dev in container]
        if pod.spec.node_name:
            for dev in granted:
                holders.setdefault(dev.uuid, []).append((name, dev))
            for m in _mig_allocations(pod):
                instances.setdefault(m.gpu_uuid, []).append(
                    MigRow(
                        profile=m.profile,
                        start=m.placement.start,
                        size=m.placement.size,
                        pod=name,
                        mig_uuid=m.mig_uuid or "",
                    )
                )
        rows.append(
            PodRow(
                pod=name,
                node=pod.spec.node_name,
                devices=[f"{d.uuid}({d.usedmem}MiB,{d.usedcores}%)" for d in granted],
                state=pod.metadata.annotations.get(BIND_PHASE, "bound") if pod.spec.node_name else "Pending",
                reason="" if pod.spec.node_name else reasons.get(pod.metadata.uid, WAITING),
            )
        )
    gpus = []
    for node in sorted(nodes, key=lambda n: n.metadata.name):
        try:
            cards = decode_node_devices(node.metadata.annotations.get(NODE_REGISTER, ""), NODE_REGISTER)
        except AnnotationError:
            cards = ()  # not a HAMi GPU node, or a registration we cannot read: nothing to show
        for card in cards:
            held = holders.get(card.id, [])
            gpus.append(
                GpuRow(
                    node=node.metadata.name,
                    uuid=card.id,
                    type=card.type,
                    memory_mib=card.devmem,
                    memory_booked_mib=sum(d.usedmem for _, d in held),
                    memory_used_mib=usage.memory_mib.get(card.id) if usage else None,
                    cores_booked=sum(d.usedcores for _, d in held),
                    core_utilization=usage.utilization.get(card.id) if usage else None,
                    slices=card.count,
                    slices_booked=len(held),
                    pods=sorted(name for name, _ in held),
                    mode=card.mode,
                    instances=sorted(instances.get(card.id, []), key=lambda r: (r.start, r.pod)),
                )
            )
    return Overview(cluster=cluster, gpus=gpus, pods=rows, metrics_url=metrics_url, metrics=metrics)


def _mig_allocations(pod: Pod) -> tuple[MigAllocation, ...]:
    try:
        return decode_mig_allocations(pod.metadata.annotations.get(MIG_ALLOCATIONS, "[]"))
    except AnnotationError:
        return ()  # unreadable: the devices annotation still shows what the pod holds


GPU_HEADERS = ("NODE", "GPU", "TYPE", "MEMORY BOOKED", "MEMORY USED", "CORES BOOKED", "CORES USED", "SLICES", "PODS")
POD_HEADERS = ("POD", "NODE", "DEVICES", "STATE")
MIG_HEADERS = ("NODE", "GPU", "PROFILE", "PLACEMENT", "MIG DEVICE", "POD")


def _gpu_cells(row: GpuRow) -> Sequence[str]:
    return (
        row.node,
        short_uuid(row.uuid),
        row.type,
        f"{row.memory_booked_mib}/{row.memory_mib} MiB",
        "-" if row.memory_used_mib is None else f"{row.memory_used_mib} MiB",
        f"{row.cores_booked}%",
        "-" if row.core_utilization is None else f"{row.core_utilization:g}%",
        f"{row.slices_booked}/{row.slices}" + (" MIG" if row.mode == MODE_MIG else ""),
        ",".join(p.split("/", 1)[1] for p in row.pods) or "-",
    )


def _pod_cells(row: PodRow) -> Sequence[str]:
    devices = " ".join(short_uuid(d.split("(", 1)[0]) + "(" + d.split("(", 1)[1] for d in row.devices) or "-"
    state = f"{row.state}: {row.reason}" if row.reason else row.state
    return (row.pod, row.node or "-", devices, state)


def _mig_cells(gpu: GpuRow, row: MigRow) -> Sequence[str]:
    return (
        gpu.node,
        short_uuid(gpu.uuid),
        row.profile,
        f"{row.start}+{row.size}",
        short_uuid(row.mig_uuid) if row.mig_uuid else "(creating)",
        row.pod.split("/", 1)[1],
    )


def render_overview(view: Overview) -> str:
    metrics = f"metrics: {view.metrics_url or '-'}" + (f" ({view.metrics})" if view.metrics != "ok" else "")
    mig = [_mig_cells(gpu, row) for gpu in view.gpus for row in gpu.instances]
    parts = [
        f"cluster: {view.cluster}",
        "",
        render_table(GPU_HEADERS, [_gpu_cells(r) for r in view.gpus]) if view.gpus else "no GPU nodes registered",
        "",
        *((render_table(MIG_HEADERS, mig), "") if mig else ()),
        render_table(POD_HEADERS, [_pod_cells(r) for r in view.pods]) if view.pods else "no GPU pods",
        "",
        metrics,
    ]
    return "\n".join(parts)
