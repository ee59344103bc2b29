"""Plain-text views of the cluster for ``hami up`` and ``hami status``: placements, and nodes × GPUs × pods.

Pure functions over typed pods and nodes (read from the apiserver, the source of truth).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hami_common.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    NODE_REGISTER,
    ContainerDevice,
    decode_node_devices,
    decode_pod_devices,
)
from hami_common.errors import AnnotationError
from hami_common.kube import Event, Node, Pod
from hami_sim.scheduler import FAILED_SCHEDULING

__all__ = [
    "FAILED_SCHEDULING",
    "allocated_devices",
    "pending_reasons",
    "placement_rows",
    "render_table",
    "short_uuid",
    "status_rows",
]

PENDING = "Pending"


def pending_reasons(events: Iterable[Event]) -> dict[str, str]:
    """pod uid -> the message of its latest ``FailedScheduling`` Event (what ``kubectl describe pod`` shows)."""
    latest: dict[str, tuple[str, str]] = {}
    for event in events:
        ref = event.involved_object
        if event.reason != FAILED_SCHEDULING or ref.kind != "Pod" or not ref.uid:
            continue
        stamp = event.last_timestamp or event.first_timestamp or ""
        if ref.uid not in latest or stamp >= latest[ref.uid][0]:
            latest[ref.uid] = (stamp, event.message)
    return {uid: message for uid, (_, message) in latest.items()}


def render_table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = [list(headers), *[list(r) for r in rows]]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def allocated_devices(pod: Pod) -> tuple[tuple[ContainerDevice, ...], ...]:
    try:
        return decode_pod_devices(pod.metadata.annotations.get(DEVICES_ALLOCATED, ""), DEVICES_ALLOCATED)
    except AnnotationError:
        return ()


def short_uuid(uuid: str) -> str:
    return uuid[:12]


def placement_rows(pods: Iterable[Pod], reasons: dict[str, str] | None = None) -> list[tuple[str, str, str, str]]:
    """(pod, node, devices, state) per pod; ``reasons`` (uid -> why) explains pods that are still pending."""
    rows = []
    for pod in sorted(pods, key=lambda p: (p.metadata.namespace, p.metadata.name)):
        grants = [
            f"{short_uuid(d.uuid)}({d.usedmem}MiB,{d.usedcores}%)"
            for container in allocated_devices(pod)
            for d in container
        ]
        if pod.spec.node_name:
            state = pod.metadata.annotations.get(BIND_PHASE, "bound")
        else:
            state = f"{PENDING}: {(reasons or {}).get(pod.metadata.uid, 'waiting to be scheduled')}"
        rows.append(
            (f"{pod.metadata.namespace}/{pod.metadata.name}", pod.spec.node_name or "-", " ".join(grants) or "-", state)
        )
    return rows


def status_rows(nodes: Iterable[Node], pods: Iterable[Pod]) -> list[tuple[str, str, str, str, str, str, str]]:
    """(node, GPU, type, memory used/total, cores used, slices used/total, pods) per registered GPU."""
    users: dict[str, list[tuple[str, ContainerDevice]]] = {}
    for pod in pods:
        if not pod.spec.node_name:
            continue
        for container in allocated_devices(pod):
            for dev in container:
                users.setdefault(dev.uuid, []).append((pod.metadata.name, dev))
    rows = []
    for node in sorted(nodes, key=lambda n: n.metadata.name):
        try:
            cards = decode_node_devices(node.metadata.annotations.get(NODE_REGISTER, ""), NODE_REGISTER)
        except AnnotationError:
            cards = ()
        for card in cards:
            held = users.get(card.id, [])
            mem = sum(d.usedmem for _, d in held)
            cores = sum(d.usedcores for _, d in held)
            rows.append(
                (
                    node.metadata.name,
                    short_uuid(card.id),
                    card.type,
                    f"{mem}/{card.devmem} MiB",
                    f"{cores}%",
                    f"{len(held)}/{card.count}",
                    ",".join(sorted(name for name, _ in held)) or "-",
                )
            )
    return rows
