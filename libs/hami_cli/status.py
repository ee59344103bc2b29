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
    NODE_REGISTER,
    ContainerDevice,
    decode_node_devices,
)
from hami_common.errors import AnnotationError
from hami_common.kube import Event, Node, Pod
from hami_common.scheduling.policy import DEFAULT_SCHEDULER_NAME
from hami_metrics.families import HOST_MEMORY_USED, HOST_UTILIZATION
from hami_sim.stack.report import allocated_devices, pending_reasons, render_table, short_uuid

__all__ = ["GpuRow", "Overview", "PodRow", "build_overview", "parse_usage", "render_overview"]

_MIB = 1024 * 1024
_FINISHED = frozenset({"Succeeded", "Failed"})  # their GPUs are free again, as HAMi counts them
WAITING = "waiting to be scheduled"


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
    rows = []
    for pod in mine:
        name = f"{pod.metadata.namespace}/{pod.metadata.name}"
        granted = [dev for container in allocated_devices(pod) for dev in container]
        if pod.spec.node_name:
            for dev in granted:
                holders.setdefault(dev.uuid, []).append((name, dev))
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
                )
            )
    return Overview(cluster=cluster, gpus=gpus, pods=rows, metrics_url=metrics_url, metrics=metrics)


GPU_HEADERS = ("NODE", "GPU", "TYPE", "MEMORY BOOKED", "MEMORY USED", "CORES BOOKED", "CORES USED", "SLICES", "PODS")
POD_HEADERS = ("POD", "NODE", "DEVICES", "STATE")


def _gpu_cells(row: GpuRow) -> Sequence[str]:
    return (
        row.node,
        short_uuid(row.uuid),
        row.type,
        f"{row.memory_booked_mib}/{row.memory_mib} MiB",
        "-" if row.memory_used_mib is None else f"{row.memory_used_mib} MiB",
        f"{row.cores_booked}%",
        "-" if row.core_utilization is None else f"{row.core_utilization:g}%",
        f"{row.slices_booked}/{row.slices}",
        ",".join(p.split("/", 1)[1] for p in row.pods) or "-",
    )


def _pod_cells(row: PodRow) -> Sequence[str]:
    devices = " ".join(short_uuid(d.split("(", 1)[0]) + "(" + d.split("(", 1)[1] for d in row.devices) or "-"
    state = f"{row.state}: {row.reason}" if row.reason else row.state
    return (row.pod, row.node or "-", devices, state)


def render_overview(view: Overview) -> str:
    metrics = f"metrics: {view.metrics_url or '-'}" + (f" ({view.metrics})" if view.metrics != "ok" else "")
    parts = [
        f"cluster: {view.cluster}",
        "",
        render_table(GPU_HEADERS, [_gpu_cells(r) for r in view.gpus]) if view.gpus else "no GPU nodes registered",
        "",
        render_table(POD_HEADERS, [_pod_cells(r) for r in view.pods]) if view.pods else "no GPU pods",
        "",
        metrics,
    ]
    return "\n".join(parts)
