"""The device families the device config enables, as the extender uses them (hami-vendors §0.2).

Every step of the extender that HAMi keeps per vendor loops over :class:`Families` here and never names
a family: a container's requests, a node's devices, the pod's preferences and node bonus per family, the
annotations a placement writes, the node locks a bind takes, and the read-back of a pod's cards after a
restart.

The first family is the **primary** one (:func:`hami_common.vendors.device_families`: the device config's
top-level knobs, NVIDIA's in HAMi), which the placement engine serves by default: its requests are
``PodRequest.init``/``app`` (read with the service's ``ResourceConfig``), its cards come first in a node's
usage and alone feed the Filter's pre-check summary, and the node's registration, pair scores and handshake
are its own (:mod:`.sync`). The **others** come from the device config's sections; a cluster without any
does none of their work. A card belongs to another family when its grant's type is that family's common
word (each family's Fit writes that word as the type, as HAMi's device lists do); every other card is the
primary family's.
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
from hami_common.vendors import DeviceFamily, NodeLockSpec, NodeView, device_families

__all__ = ["Families", "container_resources", "merge"]

log = logging.getLogger(__name__)

_NO_PLAN = PodFamilies()


def container_resources(containers: Sequence[Container]) -> list[ContainerResources]:
    return [c.as_resources() for c in containers]


@dataclass(eq=False)
class Families:
    """Every family the extender serves, the primary first (``device_families``), in configuration order.

    ``bool(families)`` says whether there are others beside the primary: the fast paths test it."""

    configured: tuple[DeviceFamily, ...] = field(default_factory=device_families)
    primary: DeviceFamily = field(init=False)
    others: tuple[DeviceFamily, ...] = field(init=False)
    _by_word: dict[str, DeviceFamily] = field(init=False, default_factory=dict)  # the others'
    _vendors: Mapping[str, Vendor] = field(init=False, default_factory=dict)
    # read on every placement and bind: the families' properties build their values on each call
    _owned: tuple[tuple[str, frozenset[str]], ...] = field(init=False, default=())
    _locks: tuple[tuple[str, NodeLockSpec], ...] = field(init=False, default=())
    _malformed: dict[tuple[str, str], str] = field(init=False, default_factory=dict)  # (node, word) -> error

    def __post_init__(self) -> None:
        if not self.configured:
            raise ValueError("no device family: the primary one comes first (hami_common.vendors.device_families)")
        self.primary, *others = self.configured
        self.others = tuple(others)
        self._by_word = {f.word: f for f in self.others}
        self._vendors = {**DEFAULT_VENDORS, **self._by_word}
        self._owned = tuple((f.word, f.owned_annotations) for f in self.configured)
        self._locks = tuple((f.word, f.node_lock) for f in self.configured)

    def __bool__(self) -> bool:
        return bool(self.others)

    @property
    def words(self) -> frozenset[str]:
        """The other families' common words."""
        return frozenset(self._by_word)

    def family_of(self, word: str) -> DeviceFamily | None:
        return self._by_word.get(word)

    # --- requests and fit --------------------------------------------------------------------------------

    def request_of(self, pod: Pod, config: ResourceConfig) -> PodRequest:
        """The primary family's request per container (read with ``config``) plus each other family's (HAMi's
        per-container vendor -> request map)."""
        return pod_request(
            container_resources(pod.spec.init_containers),
            container_resources(pod.spec.containers),
            config,
            self.others,
        )

    def plan(self, request: PodRequest, annotations: Mapping[str, str], base: PodPreferences) -> PodFamilies:
        """The fit's families for one pod: each asked family's preferences (its own use/nouse keys) and scorer."""
        if not request.families:
            return _NO_PLAN  # the primary family alone: the engine's default, no per-pod work
        asked = {r.type for container in request.families for r in container}
        used = [f for f in self.others if f.word in asked]
        return PodFamilies(
            vendors=self._vendors,
            prefs={f.word: f.preferences(base, annotations) for f in used},
            scorers=tuple(used),
        )

    def quotas(self, hards: Iterable[Mapping[str, str]]) -> dict[str, NamespaceQuota]:
        """Each other family's namespace limits from ``spec.hard`` (``limits.<memory>``, ``limits.<cores>`` of
        its :class:`~hami_common.vendors.QuotaSpec`), by word; only families with a limit set are listed."""
        hards = list(hards)
        out: dict[str, NamespaceQuota] = {}
        for f in self.others:
            spec = f.quota
            quota = quota_from_hard(hards, spec.memory_name, spec.core_name)
            if quota.memory_limit is not None or quota.cores_limit is not None:
                out[f.word] = quota
        return out

    # --- node devices ------------------------------------------------------------------------------------

    def present(self, family: DeviceFamily, node: Node) -> bool:
        """Whether the node shows this family at all: one of its resources in capacity or allocatable (its
        device plugin registered), or its handshake annotation (its plugin reported). Nodes that show none
        are skipped without reading, so a node of the primary family alone costs a few dictionary look-ups
        per other family."""
        status = node.status
        for name in family.resource_names:
            if name in status.capacity or name in status.allocatable:
                return True
        key = family.handshake_key
        return key is not None and key in node.metadata.annotations

    def node_devices(self, family: DeviceFamily, node: Node) -> tuple[DeviceUsage, ...]:
        """The family's devices on the node; a malformed source is logged once (per node and error) and
        contributes none, so it never costs the node another family's devices."""
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

    def split(self, grants: PodDevices) -> dict[str, PodDevices]:
        """Each family's cards the pod was given, by word, containers aligned (a family given none is left
        out; the primary family's entry first)."""
        words = self._by_word
        if not words:
            return {self.primary.word: grants} if any(grants) else {}
        out: dict[str, PodDevices] = {}
        primary = tuple(tuple(g for g in c if g.type not in words) for c in grants)
        if any(primary):
            out[self.primary.word] = primary
        used = {g.type for c in grants for g in c if g.type in words}
        out.update((w, tuple(tuple(g for g in c if g.type == w) for c in grants)) for w in sorted(used))
        return out

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

    def stale(self, by_family: Mapping[str, PodDevices], annotations: Mapping[str, str]) -> list[str]:
        """The annotations of families the pod was not given cards of that it still carries (an earlier
        placement's): a new placement removes them, as HAMi writes a family's lists only when it places it."""
        return sorted(
            key for word, owned in self._owned if word not in by_family for key in owned if key in annotations
        )

    def node_locks(self, by_family: Mapping[str, PodDevices], over_bus: bool) -> tuple[bool, tuple[NodeLockSpec, ...]]:
        """Whether the used families take HAMi's shared ``hami.io/mutex.lock``, and their own lock keys.
        ``over_bus``: the node's allocator is ours and takes placements over the bus, so a family it serves
        (``NodeLockSpec.bus_placed``: the lock only lets HAMi's device plugin find its pod) needs none there."""
        shared = False
        own: list[NodeLockSpec] = []
        for word, spec in self._locks:
            if word in by_family:
                if spec.bus_placed and over_bus:
                    continue
                if spec.shared:
                    shared = True
                elif spec not in own:
                    own.append(spec)
        return shared, tuple(own)

    def handed_off(self, by_family: Mapping[str, PodDevices]) -> PodDevices:
        """Per container, the cards of the families our allocator serves (``NodeLockSpec.bus_placed``): the
        binder's hand-off holds the node until their Allocate answers."""
        picked = {word: by_family[word] for word, spec in self._locks if spec.bus_placed and word in by_family}
        if len(picked) == 1:
            return next(iter(picked.values()))
        return merge(picked, max((len(p) for p in picked.values()), default=0))

    def allocated(self, annotations: Mapping[str, str]) -> dict[str, PodDevices]:
        """Each family's cards per container, read back from the pod's annotations, in configuration order;
        AnnotationError when one does not decode."""
        out: dict[str, PodDevices] = {}
        for f in self.configured:
            picked = f.allocated(annotations)
            if any(picked):
                out[f.word] = picked
        return out


def merge(by_family: Mapping[str, PodDevices], containers: int) -> PodDevices:
    """Per container: each family's cards, in the order given, as Filter grants them."""
    if len(by_family) == 1:  # the ledger reads every pod back through here: one family needs no rebuild
        (picked,) = by_family.values()
        if len(picked) >= containers:
            return tuple(picked[:containers])
    merged: list[tuple[ContainerDevice, ...]] = []
    for i in range(containers):
        cards: tuple[ContainerDevice, ...] = ()
        for picked in by_family.values():
            if i < len(picked):
                cards = (*cards, *picked[i])
        merged.append(cards)
    return tuple(merged)
