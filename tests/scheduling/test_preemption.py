"""Choosing victims on one node for a more important GPU pod (hami_common.scheduling.preemption)."""

from __future__ import annotations

from hami_common.annotations.keys import NVIDIA_VENDOR
from hami_common.scheduling import (
    Candidate,
    DeviceCharge,
    NodeUsage,
    PodPreferences,
    apply_charges,
    choose_victims,
)
from hami_common.scheduling.preemption import EXHAUSTIVE_LIMIT
from tests.scheduling.builders import card, mib, node, pod

HIGH = 1000
LOW = 10


def holding(
    uid: str, *cards: tuple[str, int], priority: int = LOW, gpu_priority: int = 1, violates_pdb: bool = False
) -> Candidate:
    """A booking of ``uid``: MiB held per card."""
    charges = tuple(DeviceCharge(uuid=c, type=NVIDIA_VENDOR, usedmem=mem, usedcores=0) for c, mem in cards)
    return Candidate(uid=uid, priority=priority, charges=charges, gpu_priority=gpu_priority, violates_pdb=violates_pdb)


def booked(n: NodeUsage, *candidates: Candidate) -> NodeUsage:
    for c in candidates:
        n = apply_charges(n, c.charges)
    return n


def victims_of(
    n: NodeUsage, want: int, *candidates: Candidate, nums: int = 1, priority: int = HIGH
) -> list[str] | None:
    choice = choose_victims(
        booked(n, *candidates), pod(mib(nums, want)), PodPreferences(), candidates, preemptor_priority=priority
    )
    return None if choice is None else sorted(v.uid for v in choice.victims)


ONE_CARD = node("n1", card("g0", totalmem=8000, count=10))
TWO_CARDS = node("n1", card("g0", totalmem=8000, count=10), card("g1", index=1, totalmem=8000, count=10))


def test_the_one_booking_that_frees_enough_memory_is_chosen_not_all_of_them() -> None:
    small, big = holding("small", ("g0", 2000)), holding("big", ("g0", 5000))
    # 1000 MiB free; 4000 wanted: giving up "big" (5000) suffices, "small" (2000) does not
    assert victims_of(ONE_CARD, 4000, small, big) == ["big"]


def test_two_small_bookings_when_no_single_one_is_enough() -> None:
    pods = [holding(f"p{i}", ("g0", 2000)) for i in range(4)]
    assert victims_of(ONE_CARD, 4000, *pods) in (["p0", "p1"], ["p0", "p2"], ["p1", "p2"], ["p0", "p3"])
    assert len(victims_of(ONE_CARD, 4000, *pods) or []) == 2


def test_equal_priority_is_never_preempted() -> None:
    peer = holding("peer", ("g0", 7000), priority=HIGH)
    assert victims_of(ONE_CARD, 4000, peer) is None


def test_only_lower_priorities_are_victims_even_when_a_peer_would_be_cheaper() -> None:
    peer, low = holding("peer", ("g0", 5000), priority=HIGH), holding("low", ("g0", 2000))
    assert victims_of(ONE_CARD, 3000, peer, low) == ["low"]


def test_a_node_where_the_pod_already_fits_is_no_candidate() -> None:
    assert victims_of(ONE_CARD, 4000, holding("low", ("g0", 1000))) is None


def test_a_node_where_even_every_victim_gone_is_not_enough_is_no_candidate() -> None:
    peer = holding("peer", ("g0", 6000), priority=HIGH)
    assert victims_of(ONE_CARD, 4000, peer, holding("low", ("g0", 2000))) is None


def test_the_least_important_victim_is_preferred_at_equal_count() -> None:
    lower, higher = holding("lower", ("g0", 4000), priority=5), holding("higher", ("g0", 4000), priority=50)
    assert victims_of(ONE_CARD, 4000, higher, lower) == ["lower"]


def test_hamis_gpu_priority_orders_victims_within_one_class() -> None:
    # nvidia.com/priority 0 is HAMi's high priority: its pod is kept when a low one does
    high_task = holding("high-task", ("g0", 4000), gpu_priority=0)
    low_task = holding("low-task", ("g0", 4000), gpu_priority=1)
    assert victims_of(ONE_CARD, 4000, high_task, low_task) == ["low-task"]


def test_a_pdb_protected_pod_is_spared_when_another_set_of_the_same_size_works() -> None:
    protected = holding("protected", ("g0", 4000), violates_pdb=True, priority=1)
    other = holding("other", ("g0", 4000), priority=5)
    assert victims_of(ONE_CARD, 4000, protected, other) == ["other"]


def test_a_pdb_protected_pod_is_taken_when_nothing_else_works() -> None:
    protected = holding("protected", ("g0", 7000), violates_pdb=True)
    assert victims_of(ONE_CARD, 4000, protected) == ["protected"]


def test_victims_on_the_right_card_for_a_multi_card_request() -> None:
    # two cards wanted with 5000 each: each card must be freed, one victim per card
    on0, on1 = holding("on0", ("g0", 6000)), holding("on1", ("g1", 6000))
    extra = holding("extra", ("g0", 1000))
    assert victims_of(TWO_CARDS, 5000, on0, on1, extra, nums=2) == ["on0", "on1"]


def test_a_multi_card_victim_frees_both_cards_at_once() -> None:
    wide = holding("wide", ("g0", 6000), ("g1", 6000))
    narrow = holding("narrow", ("g0", 1000))
    assert victims_of(TWO_CARDS, 5000, wide, narrow, nums=2) == ["wide"]


def test_slots_count_as_well_as_memory() -> None:
    full = node("n1", card("g0", totalmem=8000, count=2))
    a, b = holding("a", ("g0", 100)), holding("b", ("g0", 100))
    assert len(victims_of(full, 1000, a, b) or []) == 1


def test_the_fit_of_the_preemptor_is_returned_for_the_freed_card() -> None:
    victim = holding("v", ("g1", 7000))
    keep = holding("keep", ("g0", 7000), priority=HIGH)
    choice = choose_victims(
        booked(TWO_CARDS, victim, keep), pod(mib(1, 4000)), PodPreferences(), [victim, keep], preemptor_priority=HIGH
    )
    assert choice is not None
    assert [d.uuid for d in choice.fit.grants[0]] == ["g1"]


def test_many_candidates_fall_back_to_a_minimal_reprieve() -> None:
    pods = [holding(f"p{i:02}", ("g0", 500)) for i in range(EXHAUSTIVE_LIMIT + 4)]
    wide = node("n1", card("g0", totalmem=8000, count=100))
    chosen = victims_of(wide, 2500, *pods)
    assert chosen is not None
    free = 8000 - 500 * len(pods)
    assert free + 500 * len(chosen) >= 2500  # enough is freed
    assert free + 500 * (len(chosen) - 1) < 2500  # and no victim could have been spared
