"""The device families the device config enables, as the extender uses them (hami-vendors §0.2).

Every step of the extender that HAMi keeps per vendor loops over :class:`Families` here and never names
a family: a container's requests, a node's devices, the pod's preferences and node bonus per family, the
annotations a placement writes, the node locks a bind takes, and the read-back of a pod's cards after a
restart. NVIDIA stays on its own path (:mod:`hami_common.scheduling.nvidia`, the ``hami.io/vgpu-*`` keys);
a cluster without families configured does none of this work.

A card belongs to a family when its grant's type is the family's common word (each family's Fit writes
that word as the type, as HAMi's device lists do); every other card is NVIDIA's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hami_common import logkeys
from hami_common.annotations import ContainerDevice, PodDevices
from hami_common.errors import AnnotationError
from hami_common.kube import Container, Node, Pod
from hami_common.resources import ContainerResources, PodRequest, ResourceConfig, pod_request
from hami_common.scheduling import (
    DEFAULT_VENDORS,
    DeviceUsage,
    NamespaceQuota,
    NodeUsage,
    PodFamilies,
    PodPreferences,
    Vendor,
    quota_from_hard,
)
from hami_common.vendors import DeviceFamily, NodeLockSpec, NodeView

__all__ = ["Families", "container_resources", "merge"]

log = logging.getLogger(__name__)

_NO_PLAN = PodFamilies()


def container_resources(containers: Sequence[Container]) -> list[ContainerResources]:
    return [c.as_resources() for c in containers]


@dataclass(eq=False)
class Families:
    """The configured families (``DeviceConfig.families``), in configuration order."""

    configured: tuple[DeviceFamily, ...] = ()
    _by_word: dict[str, DeviceFamily] = field(init=False, default_factory=dict)
    _vendors: Mapping[str, Vendor] = field(init=False, default_factory=dict)
    _malformed: dict[tuple[str, str], str] = field(init=False, default_factory=dict)  # (node, word) -> error

    def __post_init__(self) -> None:
        self._by_word = {f.word: f for f in self.configured}
        self._vendors = {**DEFAULT_VENDORS, **self._by_word}

    def __bool__(self) -> bool:
        return bool(self.configured)

    @property
    def words(self) -> frozenset[str]:
        return frozenset(self._by_word)

    def family_of(self, word: str) -> DeviceFamily | None:
        return self._by_word.get(word)

    # --- requests and fit --------------------------------------------------------------------------------

    def request_of(self, pod: Pod, config: ResourceConfig) -> PodRequest:
        """NVIDIA's request per container plus each family's (HAMi's per-container vendor -> request map)."""
        return pod_request(
            container_resources(pod.spec.init_containers),
            container_resources(pod.spec.containers),
            config,
            self.configured,
        )

    def plan(self, request: PodRequest, annotations: Mapping[str, str], base: PodPreferences) -> PodFamilies:
        """The fit's families for one pod: each asked family's preferences (its own use/nouse keys) and scorer."""
        if not request.families:
            return _NO_PLAN  # NVIDIA alone: the engine's default, no per-pod work
        asked = {r.type for container in request.families for r in container}
        used = [f for f in self.configured if f.word in asked]
        return PodFamilies(
            vendors=self._vendors,
            prefs={f.word: f.preferences(base, annotations) for f in used},
            scorers=tuple(used),
        )

    def quotas(self, hards: Iterable[Mapping[str, str]]) -> dict[str, NamespaceQuota]:
        """Each family's namespace limits from ``spec.hard`` (``limits.<memory>``, ``limits.<cores>`` of its
        :class:`~hami_common.vendors.QuotaSpec`), by word; only families with a limit set are listed."""
        hards = list(hards)
        out: dict[str, NamespaceQuota] = {}
        for f in self.configured:
            spec = f.quota
            quota = quota_from_hard(hards, spec.memory_name, spec.core_name)
            if quota.memory_limit is not None or quota.cores_limit is not None:
                out[f.word] = quota
        return out

    # --- node devices ------------------------------------------------------------------------------------

    def present(self, family: DeviceFamily, node: Node) -> bool:
        """Whether the node shows this family at all: one of its resources in capacity or allocatable (its
        device plugin registered), or its handshake annotation (its plugin reported). Nodes that show none
        are skipped without reading, so a NVIDIA node costs a few dictionary look-ups per family."""
        status = node.status
        for name in family.resource_names:
            if name in status.capacity or name in status.allocatable:
                return True
        key = family.handshake_key
        return key is not None and key in node.metadata.annotations

    def node_devices(self, family: DeviceFamily, node: Node) -> tuple[DeviceUsage, ...]:
        """The family's devices on the node; a malformed source is logged once (per node and error) and
        contributes none, so it never costs the node its other families' or NVIDIA's devices."""
        name = node.metadata.name
        view = NodeView(
            name=name,
            annotations=node.metadata.annotations,
            capacity=node.status.capacity,
            allocatable=node.status.allocatable,
        )
        try:
            devices = family.node_devices(view)
        except AnnotationError as err:
            text = str(err)
            if self._malformed.get((name, family.word)) != text:
                self._malformed[(name, family.word)] = text
                log.warning("node %s: no %s devices: %s", name, family.word, text, extra={logkeys.NODE: name})
            return ()
        self._malformed.pop((name, family.word), None)
        return devices

    def forget(self, node: str) -> None:
        for word in self._by_word:
            self._malformed.pop((node, word), None)

    # --- placement ---------------------------------------------------------------------------------------

    def split(self, grants: PodDevices) -> tuple[PodDevices, dict[str, PodDevices]]:
        """NVIDIA's cards per container, and each family's that the pod was given (containers aligned)."""
        if not self._by_word:
            return grants, {}
        words = self._by_word
        nvidia = tuple(tuple(g for g in c if g.type not in words) for c in grants)
        used = {g.type for c in grants for g in c if g.type in words}
        return nvidia, {w: tuple(tuple(g for g in c if g.type == w) for c in grants) for w in used}

    def pod_annotations(
        self, node: NodeUsage, by_family: Mapping[str, PodDevices], annotations: Mapping[str, str]
    ) -> dict[str, str]:
        """Every used family's annotations (``PatchAnnotations``), in configuration order."""
        out: dict[str, str] = {}
        for f in self.configured:
            picked = by_family.get(f.word)
            if picked:
                out.update(f.pod_annotations(node, picked, annotations))
        return out

    def node_locks(self, by_family: Mapping[str, PodDevices]) -> tuple[bool, tuple[NodeLockSpec, ...]]:
        """Whether the used families take HAMi's shared ``hami.io/mutex.lock``, and their own lock keys."""
        shared = False
        own: list[NodeLockSpec] = []
        for f in self.configured:
            if f.word in by_family:
                spec = f.node_lock
                if spec.shared:
                    shared = True
                elif spec not in own:
                    own.append(spec)
        return shared, tuple(own)

    def allocated(self, annotations: Mapping[str, str]) -> dict[str, PodDevices]:
        """Each family's cards per container, read back from the pod's annotations; AnnotationError when
        one does not decode."""
        out: dict[str, PodDevices] = {}
        for f in self.configured:
            picked = f.allocated(annotations)
            if any(picked):
                out[f.word] = picked
        return out


def merge(nvidia: PodDevices, by_family: Mapping[str, PodDevices], containers: int) -> PodDevices:
    """Per container: NVIDIA's cards, then each family's (in the order given), as Filter grants them."""
    merged: list[tuple[ContainerDevice, ...]] = []
    for i in range(containers):
        cards: tuple[ContainerDevice, ...] = nvidia[i] if i < len(nvidia) else ()
        for picked in by_family.values():
            if i < len(picked):
                cards = (*cards, *picked[i])
        merged.append(cards)
    return tuple(merged)
