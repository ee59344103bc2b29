"""Plain-text views of a cluster for ``hami up`` and ``hami status``: placements, and nodes × devices × pods.

Pure functions over typed pods and nodes (read from the apiserver, the source of truth). Every configured
device family is shown, not only NVIDIA: a :class:`Fleet` holds the families and reads each one's cards from
a Node and each one's grants from a pod, through the family port (``node_devices``, ``allocated``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from hami_common.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    NODE_REGISTER,
    ContainerDevice,
    decode_node_devices,
    decode_pod_devices,
)
from hami_common.errors import AnnotationError, InvalidInput
from hami_common.kube import FAILED_SCHEDULING, Event, Node, Pod
from hami_common.resources import ResourceConfig, pod_request
from hami_common.vendors import DeviceFamily, NodeView

__all__ = [
    "NVIDIA",
    "PLACEMENT_HEADERS",
    "STATUS_HEADERS",
    "Card",
    "Fleet",
    "Grant",
    "grant_text",
    "pending_reasons",
    "placement_rows",
    "render_table",
    "short_uuid",
    "status_rows",
]

PENDING = "Pending"
STATUS_HEADERS = ("NODE", "DEVICE", "TYPE", "MEMORY", "CORES", "SLICES", "PODS")
PLACEMENT_HEADERS = ("POD", "NODE", "DEVICES", "STATE")
NVIDIA = "NVIDIA"  # the vendor column of the devices the placement engine's own backend registers


@dataclass(frozen=True, slots=True)
class Card:
    """One registered device of a node, of any family."""

    vendor: str  # the family's common word (NVIDIA, Ascend910B, MLU, DCU, ...)
    id: str
    type: str
    memory_mib: int
    slices: int
    mode: str = ""


@dataclass(frozen=True, slots=True)
class Grant:
    """One device a placement gave a pod's container."""

    vendor: str
    device: ContainerDevice


@dataclass(frozen=True)
class Fleet:
    """How the cluster's devices are read: NVIDIA's resource names and every other configured family."""

    families: tuple[DeviceFamily, ...] = ()
    resources: ResourceConfig = field(default_factory=ResourceConfig)

    def cards(self, node: Node) -> list[Card]:
        """Every device registered on ``node``; a family whose registration is absent or unreadable adds none."""
        found = []
        try:
            nvidia = decode_node_devices(node.metadata.annotations.get(NODE_REGISTER, ""), NODE_REGISTER)
        except AnnotationError:
            nvidia = ()  # not an NVIDIA node, or a registration we cannot read
        found += [Card(NVIDIA, d.id, d.type, d.devmem, d.count, d.mode) for d in nvidia]
        view = NodeView(
            name=node.metadata.name,
            annotations=node.metadata.annotations,
            capacity=node.status.capacity,
            allocatable=node.status.allocatable,
        )
        for family in self.families:
            try:
                devices = family.node_devices(view)
            except (AnnotationError, InvalidInput):
                continue
            found += [Card(family.word, d.id, d.type, d.totalmem, d.count, d.mode) for d in devices]
        return found

    def grants(self, pod: Pod) -> list[Grant]:
        """Every device the pod's placement holds, NVIDIA's first; unreadable annotations add none."""
        annotations = pod.metadata.annotations
        found = [Grant(NVIDIA, d) for container in _nvidia_allocated(annotations) for d in container]
        for family in self.families:
            try:
                held = family.allocated(annotations)
            except (AnnotationError, InvalidInput):
                continue
            found += [Grant(family.word, d) for container in held for d in container]
        return found

    def unreadable(self, pod: Pod) -> str:
        """Why the pod's device request cannot be read (a quantity out of range, say), or "" when it can."""
        try:
            pod_request(
                [c.as_resources() for c in pod.spec.init_containers],
                [c.as_resources() for c in pod.spec.containers],
                self.resources,
                self.families,
            )
        except InvalidInput as err:
            return str(err)
        return ""

    def asks_devices(self, pod: Pod) -> bool:
        """Whether any container names a managed resource (readable or not)."""
        names = {
            self.resources.count_name,
            self.resources.memory_name,
            self.resources.memory_percentage_name,
            self.resources.core_name,
            *(name for family in self.families for name in family.resource_names),
        }
        return any(
            name in names
            for c in (*pod.spec.init_containers, *pod.spec.containers)
            for name in (*c.resources.limits, *c.resources.requests)
        )


def _nvidia_allocated(annotations: Mapping[str, str]) -> tuple[tuple[ContainerDevice, ...], ...]:
    try:
        return decode_pod_devices(annotations.get(DEVICES_ALLOCATED, ""), DEVICES_ALLOCATED)
    except AnnotationError:
        return ()


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


_UUID_TAIL: Final = re.compile(r"^[A-Za-z]*-?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-")


def short_uuid(uuid: str) -> str:
    """A UUID-based id (GPU-…, ASCEND-…) cut to 12 characters; any other id (a Cambricon card is
    ``<node>-cambricon-mlu-<i>``) in full, as 12 characters of it would not tell its cards apart."""
    return uuid[:12] if _UUID_TAIL.match(uuid) else uuid


def grant_text(grant: Grant) -> str:
    d = grant.device
    return f"{short_uuid(d.uuid)}({d.usedmem}MiB,{d.usedcores}%)"


def placement_rows(
    pods: Iterable[Pod], reasons: dict[str, str] | None = None, fleet: Fleet | None = None
) -> list[tuple[str, str, str, str]]:
    """(pod, node, devices, state) per pod; ``reasons`` (uid -> why) explains pods that are still pending."""
    fleet = fleet or Fleet()
    rows = []
    for pod in sorted(pods, key=lambda p: (p.metadata.namespace, p.metadata.name)):
        grants = [grant_text(g) for g in fleet.grants(pod)]
        if pod.spec.node_name:
            state = pod.metadata.annotations.get(BIND_PHASE, "bound")
        else:
            state = f"{PENDING}: {(reasons or {}).get(pod.metadata.uid, 'waiting to be scheduled')}"
        rows.append(
            (f"{pod.metadata.namespace}/{pod.metadata.name}", pod.spec.node_name or "-", " ".join(grants) or "-", state)
        )
    return rows


def status_rows(
    nodes: Iterable[Node], pods: Iterable[Pod], fleet: Fleet | None = None
) -> list[tuple[str, str, str, str, str, str, str]]:
    """(node, device, type, memory used/total, cores used, slices used/total, pods) per registered device."""
    fleet = fleet or Fleet()
    users: dict[str, list[tuple[str, ContainerDevice]]] = {}
    for pod in pods:
        if not pod.spec.node_name:
            continue
        for grant in fleet.grants(pod):
            users.setdefault(grant.device.uuid, []).append((pod.metadata.name, grant.device))
    rows = []
    for node in sorted(nodes, key=lambda n: n.metadata.name):
        for card in fleet.cards(node):
            held = users.get(card.id, [])
            mem = sum(d.usedmem for _, d in held)
            cores = sum(d.usedcores for _, d in held)
            rows.append(
                (
                    node.metadata.name,
                    short_uuid(card.id),
                    card.type,
                    f"{mem}/{card.memory_mib} MiB",
                    f"{cores}%",
                    f"{len(held)}/{card.slices}",
                    ",".join(sorted(name for name, _ in held)) or "-",
                )
            )
    return rows
