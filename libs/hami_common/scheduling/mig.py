"""MIG placement on one card: which profile a request gets, and where on the card (hami-protocol §4.7 step 15).

A card in MIG mode registers the profiles it offers (``migProfiles``, §2.2), each with the placements the
driver accepts for it: a first memory slice and a slice count. A request gets the *smallest* allowed profile
whose memory holds it and that still has a free placement; "smallest" is HAMi's order (its
``selectMigCandidate``): least memory first, then fewest compute slices. Cores do not choose the profile, in
HAMi or here: the grant carries the profile's own memory and core values (§2.6). When the smallest fitting
profile has no free placement a larger one is tried, as HAMi does; no profile at all is
``CardMigTopologyInfeasible``.

Placements are bit masks over the card's memory slices, so "overlaps" is one ``&``. Pure functions only.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from hami_common.annotations.registration import MigPlacement, MigProfile
from hami_common.inventory._migprofiles import model_matches

__all__ = [
    "AllowlistEntry",
    "BookedInstance",
    "MigChoice",
    "allowed_profile_names",
    "allowed_profiles",
    "by_size",
    "choose_instance",
    "choose_placement",
    "mask",
    "occupied_mask",
    "overlaps",
]


@dataclass(frozen=True, slots=True)
class BookedInstance:
    """A MIG instance booked on a card: its profile and where it sits."""

    profile: str
    placement: MigPlacement


@dataclass(frozen=True, slots=True)
class MigChoice:
    """The profile a request gets on a card, and the free placement chosen for it."""

    profile: MigProfile
    placement: MigPlacement

    @property
    def booked(self) -> BookedInstance:
        return BookedInstance(profile=self.profile.name, placement=self.placement)


class AllowlistEntry(Protocol):
    """One ``migProfileAllowlist`` entry (:class:`hami_common.deviceconfig.MigAllowlist` is one)."""

    @property
    def models(self) -> Sequence[str]: ...

    @property
    def profiles(self) -> Sequence[str]: ...


def allowed_profile_names(allowlist: Sequence[AllowlistEntry], model: str) -> frozenset[str] | None:
    """The profile names the allowlist allows on a card of type ``model``; None when it says nothing of it.

    An entry applies when one of its models names the card's type as whole words (``A100-SXM4-40GB`` in
    ``NVIDIA A100-SXM4-40GB``, but ``H20`` not in ``NVIDIA H200``): the same rule the node agent registers
    profiles by (:func:`~hami_common.inventory.model_matches`), so the two never disagree. The first entry
    that applies decides; an empty allowlist, or one naming no model of this card, allows every offered profile.
    """
    for entry in allowlist:
        if any(model_matches(m, model) for m in entry.models):
            return frozenset(entry.profiles)
    return None


def by_size(profiles: Iterable[MigProfile]) -> tuple[MigProfile, ...]:
    """Smallest first, HAMi's order: least memory, then fewest slices (then name, for a stable order)."""
    return tuple(sorted(profiles, key=lambda p: (p.memory_mb, p.slice_count, p.name)))


def allowed_profiles(
    offered: Iterable[MigProfile], allowlist: Sequence[AllowlistEntry], model: str
) -> tuple[MigProfile, ...]:
    """The offered profiles the allowlist allows on this model, smallest first (:func:`by_size`)."""
    names = allowed_profile_names(allowlist, model)
    return by_size(p for p in offered if names is None or p.name in names)


def mask(placement: MigPlacement) -> int:
    """The placement's memory slices as bits: slice ``s`` is bit ``s``."""
    return ((1 << placement.size) - 1) << placement.start


def overlaps(a: MigPlacement, b: MigPlacement) -> bool:
    return bool(mask(a) & mask(b))


def occupied_mask(instances: Iterable[BookedInstance]) -> int:
    occupied = 0
    for instance in instances:
        occupied |= mask(instance.placement)
    return occupied


def _prefers_high(profile: str) -> bool:
    # HAMi fills 1g and 3g instances from the top of the card and the others from the bottom
    # (HAMi: pkg/device/nvidia/mig_topology.go); kept as the tie-break below.
    return profile.startswith(("1g.", "3g."))


def _headroom(profiles: Sequence[MigProfile], occupied: int) -> tuple[int, int]:
    """What a card with these slices taken can still host: the most slices one allowed profile can still
    get, then how many (profile, placement) pairs are still free."""
    largest = free = 0
    for p in profiles:
        n = sum(1 for pl in p.placements if pl.size and not mask(pl) & occupied)
        if n:
            free += n
            largest = max(largest, p.slice_count)
    return largest, free


def choose_placement(profile: MigProfile, occupied: int, profiles: Sequence[MigProfile] = ()) -> MigPlacement | None:
    """A free placement for ``profile`` on a card whose taken slices are ``occupied``; None when none is free.

    Which free placement: the one that leaves the card able to host the largest allowed profile, then the
    most placements, over ``profiles`` (the card's allowed profiles). A plain "largest contiguous free run"
    is not enough, because a profile may start only at fixed slices: on an A100, a ``1g`` instance at slice
    0 leaves the longest run (1-7) yet rules out the ``4g`` profile, which only starts at 0, while slice 6
    keeps it. This packs instances from one end whatever the GPU policy: MIG instances are isolated in
    hardware, so spreading them inside a card buys nothing, and fragmentation costs later requests. Ties
    follow HAMi's order (``1g``/``3g`` from the highest start, others from the lowest), so on the common
    geometries the choice is HAMi's.
    """
    free = [pl for pl in profile.placements if pl.size and not mask(pl) & occupied]
    if len(free) <= 1:
        return free[0] if free else None
    free.sort(key=lambda pl: -pl.start if _prefers_high(profile.name) else pl.start)
    best, best_room = free[0], _headroom(profiles, occupied | mask(free[0]))
    for pl in free[1:]:
        room = _headroom(profiles, occupied | mask(pl))
        if room > best_room:
            best, best_room = pl, room
    return best


@functools.lru_cache(maxsize=4096)
def choose_instance(
    profiles: tuple[MigProfile, ...], occupied: int, memreq: int, coresreq: int = 0
) -> MigChoice | None:
    """The smallest of ``profiles`` (smallest first, :func:`by_size`) whose memory holds ``memreq`` MiB, whose
    compute share holds ``coresreq`` percent and that has a free placement, with that placement; None when
    there is none (``CardMigTopologyInfeasible``).

    HAMi picks by memory alone, so a pod asking 50 % of the cores can get a 1g instance with a seventh of
    them; the request's cores count here too (a card's whole share, 100, is always enough).

    Pure, and Filter asks it for every MIG card it visits with the few requests and occupancies a cluster
    has, so the answers are cached (the placement search weighs every free placement against every profile).
    """
    for profile in profiles:
        if profile.memory_mb < memreq or profile.core < min(coresreq, 100):
            continue
        placement = choose_placement(profile, occupied, profiles)
        if placement is not None:
            return MigChoice(profile=profile, placement=placement)
    return None
