"""The cluster allocation ledger: registered cards, pods' bookings, namespace quota usage.

Plain data, no I/O: the watch handlers (:mod:`.sync`) and Filter update it, incrementally. Every change
touches only the node it concerns, whose :class:`NodeView` (usage, score, and the pre-filter summary) is
recomputed from that node's registration and bookings, so Filter never recomputes usage from all pods.
Rebuilt from annotations after a restart, it is identical to the one kept incrementally.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from hami_common.annotations import DeviceInfo, MigAllocation, PodDevices
from hami_common.scheduling import (
    DeviceCharge,
    DeviceUsage,
    NamespaceQuota,
    NodeUsage,
    apply_charges,
    device_usage_from,
    node_score,
)
from hami_common.scheduling.mig import AllowlistEntry

__all__ = ["Booking", "Ledger", "LedgerState", "NodeView", "Registration"]

_FULL_CORES = 100


@dataclass(frozen=True, slots=True)
class Registration:
    """What a node offers: the primary family's cards (registration order), pair scores and cordoned cards,
    and the other device families' devices (``families``, idle, as each family read them; after those)."""

    devices: tuple[DeviceInfo, ...]
    pair_scores: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    cordoned: frozenset[str] = frozenset()
    families: tuple[DeviceUsage, ...] = ()


@dataclass(frozen=True, slots=True)
class Booking:
    """One pod's hold on one node: its grants per container (init first) and the collapsed charges.

    A pod on MIG cards also holds instances: ``mig`` are its reservations (``hami.io/vgpu-mig-allocations``)
    and each charge carries the instances on its card, so booking and releasing the charges books and frees
    their placements."""

    uid: str
    namespace: str
    name: str
    node: str
    grants: PodDevices
    init_count: int
    charges: tuple[DeviceCharge, ...]
    mig: tuple[MigAllocation, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as Filter reads it: usage with every booking applied, its score, and a cheap summary."""

    usage: NodeUsage
    score: float
    free_cards: int  # healthy, uncordoned cards with a free slot
    max_free_memory: int  # MiB, over those cards
    max_free_cores: int
    free_mig_cards: int = 0  # of those, the cards in MIG mode

    def may_fit(self, nums: int, memreq: int, cores: int) -> bool:
        """A sound pre-filter: False only when no card set could satisfy one container's request.

        A MIG card may hold several of one container's instances, so a node with one asks no card count."""
        return (
            (nums <= self.free_cards or self.free_mig_cards > 0)
            and memreq <= self.max_free_memory
            and min(cores, _FULL_CORES) <= (self.max_free_cores)
        )


def _view(usage: NodeUsage, primary: int | None = None) -> NodeView:
    """``primary``: how many of the node's devices (the first ones) are the primary family's, when others
    follow; the summary covers those only, as only its requests are pre-filtered (the others' Fit differs)."""
    devices = usage.devices if primary is None else usage.devices[:primary]
    free = [d for d in devices if d.health and d.has_free_slot and d.id not in usage.cordoned]
    return NodeView(
        usage=usage,
        score=node_score(usage.devices),
        free_cards=len(free),
        max_free_memory=max((d.free_memory for d in free), default=-1),
        max_free_cores=max((d.totalcore - d.usedcores for d in free), default=-1),
        free_mig_cards=sum(1 for d in free if d.is_mig),
    )


@dataclass(frozen=True, slots=True)
class LedgerState:
    """A comparable picture of the ledger, for tests and diagnostics."""

    nodes: Mapping[str, NodeUsage]
    bookings: Mapping[str, Booking]
    quota_used: Mapping[str, tuple[int, int]]


class Ledger:
    """Not thread-safe: used from the event loop only, and never across an ``await``.

    ``mig_allowlist`` is the device config's ``migProfileAllowlist``: a MIG card offers the profiles it
    allows for the card's model (all of them when it names none)."""

    def __init__(
        self, mig_allowlist: Sequence[AllowlistEntry] = (), family_words: AbstractSet[str] = frozenset()
    ) -> None:
        self.mig_allowlist: tuple[AllowlistEntry, ...] = tuple(mig_allowlist)
        # the other device families' common words: their cards count against their own quota, not the primary's
        self.family_words = frozenset(family_words)
        self._family_limits: dict[tuple[str, str], NamespaceQuota] = {}
        self._family_used: dict[tuple[str, str], tuple[int, int]] = {}
        self._registrations: dict[str, Registration] = {}
        self._views: dict[str, NodeView] = {}
        self._order: list[tuple[float, str]] = []  # (score, node), ascending: Filter's visiting order
        self._bookings: dict[str, Booking] = {}
        self._by_node: dict[str, set[str]] = {}
        # bookings undone by a refused bind, until the pod is filtered again or goes: the watch may still
        # deliver the Filter's patch that made them, which must not book them back
        self._withdrawn: dict[str, Booking] = {}
        # the placement annotations of bookings whose Filter wrote nothing: their Binding carries them
        self._placements: dict[str, Mapping[str, str]] = {}
        self._limits: dict[str, NamespaceQuota] = {}
        self._used: dict[str, tuple[int, int]] = {}
        self.version = 0  # bumped on every change
        self._membership = 0  # bumped when a node registers or leaves
        self._missing: tuple[AbstractSet[str], int, tuple[str, ...]] | None = None

    # --- nodes ---------------------------------------------------------------------------------------------

    def register(self, node: str, registration: Registration) -> None:
        if self._registrations.get(node) == registration:
            return
        self._registrations[node] = registration
        self._rebuild(node)

    def forget(self, node: str) -> None:
        if self._registrations.pop(node, None) is not None:
            self._drop_view(node)
            self._membership += 1
            self.version += 1

    def _rebuild(self, node: str) -> None:
        registration = self._registrations[node]
        usage = NodeUsage(
            name=node,
            devices=(
                *(device_usage_from(d, self.mig_allowlist) for d in registration.devices),
                *registration.families,
            ),
            pair_scores=registration.pair_scores,
            cordoned=registration.cordoned,
        )
        for uid in sorted(self._by_node.get(node, ())):
            usage = apply_charges(usage, self._bookings[uid].charges)
        self._set_view(node, _view(usage, self._primary_count(node)))
        self.version += 1

    def _primary_count(self, node: str) -> int | None:
        registration = self._registrations.get(node)
        if registration is None or not registration.families:
            return None
        return len(registration.devices)

    def view(self, node: str) -> NodeView | None:
        return self._views.get(node)

    def candidates(
        self, names: Sequence[str], spread: bool, wanted: AbstractSet[str] | None = None
    ) -> tuple[Iterator[NodeView], list[str]]:
        """The registered ``names`` best first for the node policy (binpack: most used first; spread: least
        used first; ties by node name), lazily, and the names that are not registered.

        The ledger keeps every node ordered by score as it changes, so Filter walks that order only until
        the first node that fits. ``wanted`` is ``names`` as a set, when the caller has it already; the
        unregistered names are remembered for it until a node registers or leaves."""
        views = self._views
        if wanted is None:
            wanted = frozenset(names)
        remembered = self._missing
        if remembered is not None and remembered[0] is wanted and remembered[1] == self._membership:
            missing = list(remembered[2])
        else:
            unknown = wanted.difference(views) if isinstance(wanted, frozenset) else set(wanted).difference(views)
            missing = [name for name in names if name in unknown] if unknown else []
            self._missing = (wanted, self._membership, tuple(missing))
        order = self._order if spread else reversed(self._order)
        return (views[name] for _, name in order if name in wanted), missing

    def views(self) -> Iterator[tuple[str, NodeView]]:
        return iter(self._views.items())

    def __contains__(self, node: str) -> bool:
        return node in self._views

    # --- bookings ------------------------------------------------------------------------------------------

    def booking(self, uid: str) -> Booking | None:
        return self._bookings.get(uid)

    def bookings_on(self, node: str) -> list[Booking]:
        """The bookings held on ``node``, by pod UID."""
        return [self._bookings[uid] for uid in sorted(self._by_node.get(node, ()))]

    def book(self, booking: Booking) -> None:
        """Add or replace a pod's booking; a no-op when it is the same as the one held."""
        self._withdrawn.pop(booking.uid, None)
        previous = self._bookings.get(booking.uid)
        if previous == booking:
            return
        if previous is not None:
            self.release(booking.uid)
        self._bookings[booking.uid] = booking
        self._by_node.setdefault(booking.node, set()).add(booking.uid)
        self._charge_quota(booking, 1)
        self._apply(booking, 1)

    def release(self, uid: str) -> Booking | None:
        self._withdrawn.pop(uid, None)
        self._placements.pop(uid, None)
        booking = self._bookings.pop(uid, None)
        if booking is None:
            return None
        holders = self._by_node.get(booking.node)
        if holders is not None:
            holders.discard(uid)
            if not holders:
                del self._by_node[booking.node]
        self._charge_quota(booking, -1)
        self._apply(booking, -1)
        return booking

    def defer_placement(self, uid: str, annotations: Mapping[str, str]) -> None:
        """Keep the annotations of the pod's booking for its Binding (Filter did not write them); they go
        with the booking, or once :meth:`placed`."""
        if uid in self._bookings:
            self._placements[uid] = annotations

    def placement(self, uid: str) -> Mapping[str, str] | None:
        """The annotations the pod's Binding must carry, if its Filter deferred them."""
        return self._placements.get(uid)

    def placed(self, uid: str) -> None:
        """The Binding carried the pod's placement: the pod holds it now."""
        self._placements.pop(uid, None)

    def withdraw(self, uid: str) -> None:
        """Release a pod's booking for good: the same placement seen again on the watch (the Filter's own
        patch, delivered late) is :meth:`withdrawn`, not booked back; a new Filter's booking replaces it."""
        booking = self.release(uid)
        if booking is not None:
            self._withdrawn[uid] = booking

    def withdrawn(self, uid: str) -> Booking | None:
        return self._withdrawn.get(uid)

    def _apply(self, booking: Booking, sign: int) -> None:
        view = self._views.get(booking.node)
        if view is not None:
            usage = apply_charges(view.usage, booking.charges, sign)
            self._set_view(booking.node, _view(usage, self._primary_count(booking.node)))
        self.version += 1

    def _drop_view(self, node: str) -> NodeView | None:
        old = self._views.pop(node, None)
        if old is not None:
            del self._order[bisect.bisect_left(self._order, (old.score, node))]
        return old

    def _set_view(self, node: str, view: NodeView) -> None:
        if self._drop_view(node) is None:
            self._membership += 1
        self._views[node] = view
        bisect.insort(self._order, (view.score, node))

    # --- quota ---------------------------------------------------------------------------------------------

    def set_quota(self, namespace: str, limits: NamespaceQuota | None) -> None:
        if limits is None or (limits.memory_limit is None and limits.cores_limit is None):
            self._limits.pop(namespace, None)
        else:
            self._limits[namespace] = limits

    def quota(self, namespace: str) -> NamespaceQuota | None:
        limits = self._limits.get(namespace)
        if limits is None:
            return None
        mem, cores = self._used.get(namespace, (0, 0))
        return NamespaceQuota(
            memory_limit=limits.memory_limit, cores_limit=limits.cores_limit, used_memory=mem, used_cores=cores
        )

    def set_family_quotas(self, namespace: str, limits: Mapping[str, NamespaceQuota]) -> None:
        """The namespace's limits per family word (replacing the earlier ones)."""
        for key in [k for k in self._family_limits if k[0] == namespace]:
            del self._family_limits[key]
        for word, quota in limits.items():
            self._family_limits[(namespace, word)] = quota

    def family_quotas(self, namespace: str) -> dict[str, NamespaceQuota]:
        """The families' quotas in ``namespace`` with what its pods hold, by word (none set: empty)."""
        if not self._family_limits:
            return {}
        out: dict[str, NamespaceQuota] = {}
        for (ns, word), limits in self._family_limits.items():
            if ns == namespace:
                mem, cores = self._family_used.get((ns, word), (0, 0))
                out[word] = NamespaceQuota(
                    memory_limit=limits.memory_limit, cores_limit=limits.cores_limit, used_memory=mem, used_cores=cores
                )
        return out

    def _charge_quota(self, booking: Booking, sign: int) -> None:
        charges = booking.charges
        if self.family_words:
            own = [c for c in charges if c.type in self.family_words]
            if own:
                charges = tuple(c for c in charges if c.type not in self.family_words)
                for c in own:
                    key = (booking.namespace, c.type)
                    mem, cores = self._family_used.get(key, (0, 0))
                    mem, cores = mem + sign * c.usedmem, cores + sign * c.usedcores
                    if mem == 0 and cores == 0:
                        self._family_used.pop(key, None)
                    else:
                        self._family_used[key] = (mem, cores)
        mem, cores = self._used.get(booking.namespace, (0, 0))
        mem += sign * sum(c.usedmem for c in charges)
        cores += sign * sum(c.usedcores for c in charges)
        if mem == 0 and cores == 0:
            self._used.pop(booking.namespace, None)
        else:
            self._used[booking.namespace] = (mem, cores)

    # --- inspection ----------------------------------------------------------------------------------------

    def state(self) -> LedgerState:
        return LedgerState(
            nodes={name: view.usage for name, view in sorted(self._views.items())},
            bookings=dict(sorted(self._bookings.items())),
            quota_used=dict(sorted(self._used.items())),
        )
