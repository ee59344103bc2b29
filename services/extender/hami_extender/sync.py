"""From watched Kubernetes objects to ledger entries (hami-protocol §4.2): pure readers and one handler.

A pod holds cards when it carries ``hami.io/vgpu-node`` and ``hami.io/vgpu-devices-allocated`` and has not
finished; once every init container has exited 0, only its app containers count. A node is registered
while ``hami.io/node-nvidia-register`` lists at least one card and the node passes HAMi's handshake check
(:mod:`.handshake`): the primary family's registration, pair scores and handshake; or while another
configured family finds devices there (:mod:`.families`): each family is read and judged on its own, so one
family's bad annotation or failed handshake drops only its devices. A pod's cards are read back from every
family's list.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from hami_common import logkeys
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_FAILED,
    BIND_PHASE_SUCCESS,
    MIG_ALLOCATIONS,
    NODE_PLACEMENTS,
    NODE_PLACEMENTS_BUS,
    NODE_REGISTER,
    NODE_SCORE,
    VGPU_NODE,
    MigAllocation,
    decode_mig_allocations,
    decode_node_devices,
    decode_pair_scores,
)
from hami_common.errors import AnnotationError
from hami_common.kube import Change, Node, Pod, ResourceQuota
from hami_common.resources import ResourceConfig
from hami_common.scheduling import DeviceUsage, collapse_devices, cordoned_devices, quota_from_hard
from hami_extender.families import Families, merge
from hami_extender.handshake import NodeHandshakes
from hami_extender.ledger import Booking, Ledger, Registration

__all__ = ["FINISHED_PHASES", "LedgerSync", "booking_from", "placed_over_bus", "registration_from"]

log = logging.getLogger(__name__)

FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})


def registration_from(node: Node) -> Registration | None:
    """The node's cards, or None when it registers none. Raises ``AnnotationError`` for a bad value."""
    annotations = node.metadata.annotations
    value = annotations.get(NODE_REGISTER)
    if not value:
        return None
    devices = decode_node_devices(value)
    if not devices:
        return None
    scores: Mapping[str, Mapping[str, int]] = {}
    score_text = annotations.get(NODE_SCORE)
    if score_text:
        try:
            scores = decode_pair_scores(score_text)
        except AnnotationError as err:
            log.warning(
                "node %s: ignoring pair scores: %s", node.metadata.name, err, extra={logkeys.NODE: node.metadata.name}
            )
    return Registration(devices=devices, pair_scores=scores, cordoned=cordoned_devices(annotations))


def placed_over_bus(node: Node | None) -> bool:
    """Whether the node's allocator is ours, which takes placements over NATS (its node agent says so)."""
    return node is not None and node.metadata.annotations.get(NODE_PLACEMENTS) == NODE_PLACEMENTS_BUS


def _same_for_ledger(old: Pod, new: Pod) -> bool:
    """Whether what :func:`booking_from` reads is unchanged: annotations, phase, init container outcomes."""
    return (
        old.metadata.uid == new.metadata.uid
        and old.status.phase == new.status.phase
        and old.metadata.annotations == new.metadata.annotations
        and (not new.spec.init_containers or old.status.init_container_statuses == new.status.init_container_statuses)
    )


def _init_done(pod: Pod) -> bool:
    statuses = pod.status.init_container_statuses
    if not pod.spec.init_containers or len(statuses) < len(pod.spec.init_containers):
        return False
    return all(s.state.terminated is not None and s.state.terminated.exit_code == 0 for s in statuses)


_NO_FAMILIES = Families()


def booking_from(pod: Pod, families: Families = _NO_FAMILIES) -> Booking | None:
    """What the pod holds according to its annotations; None when it holds nothing (any more).

    A MIG pod also holds the instances of ``hami.io/vgpu-mig-allocations``, all of them until the pod
    finishes: an instance lives as long as its pod, a finished init container's too. A pod's cards of the
    ``families`` are read from each family's own list, in configuration order within each container, as
    Filter grants them. Raises ``AnnotationError`` when an annotation does not decode."""
    meta = pod.metadata
    node = meta.annotations.get(VGPU_NODE)
    if not node or pod.status.phase in FINISHED_PHASES:
        return None
    by_family = families.allocated(meta.annotations)
    if not by_family:
        return None
    init_count = len(pod.spec.init_containers)
    containers = init_count + len(pod.spec.containers)
    if not pod.spec.containers:
        containers = max(len(picked) for picked in by_family.values())
    grants = merge(by_family, containers)
    init, app = grants[:init_count], grants[init_count:]
    if _init_done(pod):
        init = ()
    mig: tuple[MigAllocation, ...] = ()
    mig_text = meta.annotations.get(MIG_ALLOCATIONS)
    if mig_text:
        mig = decode_mig_allocations(mig_text)
    return Booking(
        uid=meta.uid,
        namespace=meta.namespace,
        name=meta.name,
        node=node,
        grants=grants,
        init_count=init_count,
        charges=collapse_devices(init, app, mig),
        mig=mig,
    )


@dataclass(eq=False)
class LedgerSync:
    """Watch handlers that keep the ledger current; ``on_pod_gone`` and ``on_bind_phase`` tell the hand-off."""

    ledger: Ledger
    on_pod_gone: Callable[[str], None] = lambda uid: None
    on_bind_settled: Callable[[str], None] = lambda uid: None
    handshakes: NodeHandshakes | None = None  # None: judge no handshakes (tests of the ledger alone)
    resources: ResourceConfig = field(default_factory=ResourceConfig)  # quota keys follow the resource names
    families: Families = field(default_factory=Families)  # every device family, the primary first
    malformed: int = 0
    _quotas: dict[str, dict[str, Mapping[str, str]]] = field(default_factory=dict)

    def on_pod(self, change: Change[Pod]) -> None:
        pod = change.obj
        uid = pod.metadata.uid
        if change.type == "DELETED":
            self.ledger.release(uid)
            self.on_pod_gone(uid)
            return
        if VGPU_NODE not in pod.metadata.annotations:
            return  # not ours yet; a reservation made by Filter stands until the patch is seen
        if change.old is not None and _same_for_ledger(change.old, pod):
            return  # a write the ledger does not read (the kubelet's status): nothing to decode again
        try:
            booking = booking_from(pod, self.families)
        except AnnotationError as err:
            self.malformed += 1
            log.warning("pod %s/%s: %s", pod.metadata.namespace, pod.metadata.name, err, extra={logkeys.POD_UID: uid})
            return
        if booking is None:
            self.ledger.release(uid)
            self.on_pod_gone(uid)
        elif booking != self.ledger.withdrawn(uid):  # a refused bind's placement stays undone
            self.ledger.book(booking)
        if pod.metadata.annotations.get(BIND_PHASE) in (BIND_PHASE_SUCCESS, BIND_PHASE_FAILED):
            self.on_bind_settled(uid)

    def on_node(self, change: Change[Node]) -> None:
        name = change.obj.metadata.name
        if change.type == "DELETED":
            self.ledger.forget(name)
            if self.handshakes is not None:
                self.handshakes.forget(name)
                for word in self.families.words:
                    self.handshakes.forget_family(name, word)
            self.families.forget(name)
            return
        self.judge(change.obj)

    def judge(self, node: Node, *, on_pass: bool = False) -> None:
        """Register the node's cards, or drop them: unregistered, malformed, or failing the handshake."""
        name = node.metadata.name
        try:
            registration = registration_from(node)
        except AnnotationError as err:
            self.malformed += 1
            log.warning("node %s is not registered: %s", name, err, extra={logkeys.NODE: name})
            registration = None
        if registration is not None and self.handshakes is not None:
            # only registered GPU nodes take part in the handshake, as in HAMi's registration loop
            if not self.handshakes.admit(node, node.metadata.annotations[NODE_REGISTER], on_pass=on_pass):
                registration = None
        elif self.handshakes is not None:
            self.handshakes.forget(name)
        if self.families:
            extra = self._family_devices(node, on_pass)
            if extra:
                base = registration if registration is not None else Registration(devices=())
                registration = dataclasses.replace(base, families=extra)
        if registration is None:
            self.ledger.forget(name)
        else:
            self.ledger.register(name, registration)

    def _family_devices(self, node: Node, on_pass: bool) -> tuple[DeviceUsage, ...]:
        """Every configured family's devices on the node that passes its handshake (HAMi's loop: read the
        devices, then CheckHealth; unhealthy drops that family's devices only)."""
        name = node.metadata.name
        out: list[DeviceUsage] = []
        for family in self.families.others:
            if not self.families.present(family, node):
                if self.handshakes is not None:
                    self.handshakes.forget_family(name, family.word)
                continue
            devices = self.families.node_devices(family, node)
            if not devices:
                continue
            if self.handshakes is not None and not self.handshakes.admit_family(node, family, on_pass=on_pass):
                continue
            out.extend(devices)
        return tuple(out)

    def judge_again(self, node: Node) -> None:
        """A pass of the handshake checks (HAMi's 15-second loop) revisits the node."""
        self.judge(node, on_pass=True)

    def on_quota(self, change: Change[ResourceQuota]) -> None:
        meta = change.obj.metadata
        quotas = self._quotas.setdefault(meta.namespace, {})
        if change.type == "DELETED":
            quotas.pop(meta.name, None)
        else:
            quotas[meta.name] = dict(change.obj.spec.hard)
        self.ledger.set_quota(
            meta.namespace,
            quota_from_hard(quotas.values(), self.resources.memory_name, self.resources.core_name) if quotas else None,
        )
        if self.families:
            self.ledger.set_family_quotas(meta.namespace, self.families.quotas(quotas.values()))
