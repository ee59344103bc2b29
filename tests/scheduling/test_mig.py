"""MIG placement: profile selection, placement, Fit on MIG cards, and the reservations it writes.

The A100-40GB table is NVML's (memory in MiB, placements in memory slices): 1g.5gb at slices 0-6, 2g.10gb at
0/2/4 (2 slices), 3g.20gb at 0/4 (4 slices), 4g.20gb at 0 (4 slices), 7g.40gb at 0 (8 slices).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest

from hami_common.annotations import (
    DeviceInfo,
    MigAllocation,
    decode_mig_allocations,
    decode_node_devices,
    encode_mig_allocations,
    encode_node_devices,
)
from hami_common.annotations.registration import MODE_MIG, MigPlacement, MigProfile
from hami_common.deviceconfig import MigAllowlist
from hami_common.scheduling import (
    NVIDIA,
    Candidate,
    DeviceUsage,
    NodeUsage,
    PodPreferences,
    Reason,
    apply_charges,
    choose_victims,
    device_usage_from,
    fit_container,
    fit_node,
)
from hami_common.scheduling.mig import (
    BookedInstance,
    allowed_profile_names,
    allowed_profiles,
    by_size,
    choose_instance,
    choose_placement,
    mask,
    occupied_mask,
)
from tests.scheduling.builders import card, ctx, mib, node, pod


def _profile(name: str, memory: int, core: int, slices: int, starts: Sequence[int], size: int) -> MigProfile:
    return MigProfile(
        name=name,
        memory_mb=memory,
        core=core,
        slice_count=slices,
        placements=tuple(MigPlacement(start=s, size=size) for s in starts),
    )


A100_40GB = (
    _profile("1g.5gb", 4864, 14, 1, range(7), 1),
    _profile("2g.10gb", 9856, 28, 2, (0, 2, 4), 2),
    _profile("3g.20gb", 19968, 42, 3, (0, 4), 4),
    _profile("4g.20gb", 19968, 57, 4, (0,), 4),
    _profile("7g.40gb", 40192, 100, 7, (0,), 8),
)
SMALLEST_FIRST = by_size(A100_40GB)
MODEL = "NVIDIA A100-SXM4-40GB"


def named(name: str) -> MigProfile:
    return next(p for p in A100_40GB if p.name == name)


def taken(*placements: tuple[int, int]) -> int:
    return occupied_mask(BookedInstance("x", MigPlacement(start=s, size=n)) for s, n in placements)


def mig_card(
    id: str = "g0", *instances: tuple[str, int], profiles: Sequence[MigProfile] = A100_40GB, **kw: object
) -> DeviceUsage:
    """An A100 in MIG mode with ``instances`` (profile, start) already booked, charged like the ledger does."""
    booked = tuple(BookedInstance(p, MigPlacement(start=s, size=_size(p, profiles))) for p, s in instances)
    fields: dict[str, object] = {
        "count": 7,
        "totalmem": 40960,
        "type": MODEL,
        "mode": MODE_MIG,
        "mig_profiles": by_size(profiles),
        "mig_instances": booked,
        "used": len(booked),
        "usedmem": sum(_memory(b.profile, profiles) for b in booked),
        "usedcores": sum(_core(b.profile, profiles) for b in booked),
    }
    fields.update(kw)
    return card(id, **fields)


def _by_name(name: str, profiles: Sequence[MigProfile]) -> MigProfile:
    return next(p for p in profiles if p.name == name)


def _size(name: str, profiles: Sequence[MigProfile]) -> int:
    return _by_name(name, profiles).placements[0].size


def _memory(name: str, profiles: Sequence[MigProfile]) -> int:
    return _by_name(name, profiles).memory_mb


def _core(name: str, profiles: Sequence[MigProfile]) -> int:
    return _by_name(name, profiles).core


# --- which profile ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memreq", "occupied", "expected"),
    [
        pytest.param(4000, 0, "1g.5gb", id="a request under the smallest profile's memory gets the smallest"),
        pytest.param(4864, 0, "1g.5gb", id="a request of exactly a profile's memory gets that profile"),
        pytest.param(5000, 0, "2g.10gb", id="a request just over 1g.5gb gets 2g.10gb"),
        pytest.param(15000, 0, "3g.20gb", id="equal memory: the profile with fewer slices (3g over 4g)"),
        pytest.param(30000, 0, "7g.40gb", id="a request over 4g.20gb gets the whole card"),
        pytest.param(41000, 0, None, id="a request over every profile gets none"),
        pytest.param(15000, taken((4, 1)), "3g.20gb", id="3g.20gb's top placement taken: its bottom one"),
        pytest.param(15000, taken((0, 1), (4, 1)), None, id="fragmented: no 3g/4g placement is free"),
    ],
)
def test_the_smallest_profile_that_holds_the_memory_and_has_room_is_chosen(
    memreq: int, occupied: int, expected: str | None
) -> None:
    choice = choose_instance(SMALLEST_FIRST, occupied, memreq)
    assert (choice.profile.name if choice else None) == expected


def test_a_larger_profile_is_taken_when_the_smallest_fitting_one_has_no_free_placement() -> None:
    small = _profile("1g.5gb", 4864, 14, 1, (6,), 1)  # an allowlist-trimmed table: one 1g placement only
    larger = _profile("2g.10gb", 9856, 28, 2, (0, 2, 4), 2)
    choice = choose_instance((small, larger), taken((6, 1)), 1000)
    assert choice is not None
    assert (choice.profile.name, choice.placement.start) == ("2g.10gb", 0)


def test_a_seven_slice_card_with_instances_at_0_and_4_refuses_a_4_slice_profile() -> None:
    occupied = taken((0, 1), (4, 1))  # 33 GiB of the card's 40 are free, yet no 4-slice range is
    assert choose_placement(named("4g.20gb"), occupied, SMALLEST_FIRST) is None
    assert choose_placement(named("3g.20gb"), occupied, SMALLEST_FIRST) is None
    assert choose_instance(SMALLEST_FIRST, occupied, 15000) is None
    # either instance alone leaves a 4-slice range
    only_at_0 = choose_instance(SMALLEST_FIRST, taken((0, 1)), 15000)
    only_at_4 = choose_instance(SMALLEST_FIRST, taken((4, 1)), 15000)
    assert only_at_0 is not None
    assert (only_at_0.profile.name, only_at_0.placement.start) == ("3g.20gb", 4)
    assert only_at_4 is not None
    assert (only_at_4.profile.name, only_at_4.placement.start) == ("3g.20gb", 0)
    # and through Fit: HAMi's reason
    fragmented = mig_card("g0", ("1g.5gb", 0), ("1g.5gb", 4))
    assert NVIDIA.fit([fragmented], mib(1, 15000), ctx()).rejected == {Reason.CARD_MIG_TOPOLOGY_INFEASIBLE: 1}


def test_the_requests_cores_choose_the_profile_too_and_the_grant_carries_the_profiles_values() -> None:
    fit = NVIDIA.fit([mig_card()], mib(1, 4000, cores=50), ctx())
    assert fit.fits
    assert fit.mig[0].profile == "4g.20gb"  # 1g-3g hold the memory but not half the cores (14/28/42 %)
    assert (fit.devices[0].usedmem, fit.devices[0].usedcores) == (19968, 57)  # the profile's, not 4000 / 50
    small = NVIDIA.fit([mig_card()], mib(1, 4000, cores=10), ctx())
    assert small.mig[0].profile == "1g.5gb"
    assert (small.devices[0].usedmem, small.devices[0].usedcores) == (4864, 14)


# --- where on the card -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "occupied", "start"),
    [
        pytest.param("1g.5gb", 0, 6, id="1g on an empty card: the top slice, which keeps 4g.20gb at 0 possible"),
        pytest.param("1g.5gb", taken((6, 1)), 5, id="1g next to the 1g at the top: instances pack from one end"),
        pytest.param("1g.5gb", taken((4, 2)), 6, id="1g beside a 2g at 4: slices 0-3 stay free for a 4g"),
        pytest.param("2g.10gb", 0, 4, id="2g on an empty card: at 4, not 0, so 4g.20gb still fits at 0"),
        pytest.param("3g.20gb", 0, 4, id="3g on an empty card: at 4, so 4g.20gb still fits at 0"),
        pytest.param("3g.20gb", taken((6, 1)), 0, id="3g when the top half is cut: the only free placement"),
        pytest.param("2g.10gb", taken((0, 1), (2, 1), (4, 1)), None, id="no 2g placement without an overlap"),
    ],
)
def test_the_free_placement_that_keeps_the_most_room_is_chosen(profile: str, occupied: int, start: int | None) -> None:
    placement = choose_placement(named(profile), occupied, SMALLEST_FIRST)
    assert (placement.start if placement else None) == start
    if placement is not None:
        assert not mask(placement) & occupied


# --- the allowlist ---------------------------------------------------------------------------------------

CHART_ALLOWLIST = (
    MigAllowlist(models=("A30",), profiles=("1g.6gb", "2g.12gb", "4g.24gb")),
    MigAllowlist(models=("A100-SXM4-40GB", "A100-PCIE-40GB"), profiles=("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")),
)


def test_the_allowlist_entry_naming_the_cards_model_decides_and_an_unnamed_model_allows_all() -> None:
    assert allowed_profile_names(CHART_ALLOWLIST, MODEL) == frozenset({"1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"})
    assert allowed_profile_names(CHART_ALLOWLIST, "NVIDIA H100 80GB HBM3") is None
    assert allowed_profile_names((), MODEL) is None
    names = [p.name for p in allowed_profiles(A100_40GB, CHART_ALLOWLIST, MODEL)]
    assert names == ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]  # 4g.20gb is not allowed here


def test_an_allowlist_model_matches_whole_words_as_the_node_agent_registers_them() -> None:
    h20 = (MigAllowlist(models=("H20",), profiles=("1g.12gb",)),)
    assert allowed_profile_names(h20, "NVIDIA H20") == frozenset({"1g.12gb"})
    assert allowed_profile_names(h20, "NVIDIA H200") is None  # H20's entry must not trim an H200's profiles


def test_a_registered_mig_card_offers_only_allowed_profiles_and_an_ordinary_card_none() -> None:
    info = DeviceInfo(
        id="g0", count=7, devmem=40960, devcore=100, type=MODEL, mode=MODE_MIG, mig_profiles=A100_40GB, health=True
    )
    dev = device_usage_from(info, CHART_ALLOWLIST)
    assert [p.name for p in dev.mig_profiles] == ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
    # 15000 MiB: 3g.20gb is the smallest allowed; with 3g's placements taken, 4g.20gb is not allowed either
    assert NVIDIA.fit([dev], mib(1, 15000), ctx()).devices[0].usedmem == 19968
    blocked = dev.with_instances(
        [
            BookedInstance("1g.5gb", MigPlacement(start=0, size=1)),
            BookedInstance("1g.5gb", MigPlacement(start=4, size=1)),
        ]
    )
    assert NVIDIA.fit([blocked], mib(1, 15000), ctx()).rejected == {Reason.CARD_MIG_TOPOLOGY_INFEASIBLE: 1}
    plain = device_usage_from(
        DeviceInfo(id="g1", count=10, devmem=40960, devcore=100, type=MODEL, mig_profiles=A100_40GB)
    )
    assert plain.mig_profiles == ()
    assert not plain.is_mig


# --- Fit on MIG cards ------------------------------------------------------------------------------------


def test_a_mig_card_grants_an_instance_with_its_profile_and_placement() -> None:
    fit = NVIDIA.fit([mig_card()], mib(1, 9000), ctx())
    assert fit.devices[0].usedmem == 9856
    assert fit.mig == (
        MigAllocation(
            container_index=0, device_index=0, gpu_uuid="g0", profile="2g.10gb", placement=MigPlacement(start=4, size=2)
        ),
    )


def test_a_fully_cut_card_is_rejected_as_mig_topology_infeasible() -> None:
    full = mig_card("g0", *(("1g.5gb", s) for s in range(7)), count=8)
    fit = fit_container([full], mib(1, 1000), ctx())
    assert not fit.fits
    assert fit.rejected == {Reason.CARD_MIG_TOPOLOGY_INFEASIBLE: 1}


def test_several_instances_of_one_container_land_on_one_mig_card_without_overlap() -> None:
    fit = fit_container([mig_card()], mib(3, 4000), ctx(node("n", mig_card())))
    assert fit.fits
    assert [d.uuid for d in fit.devices] == ["g0", "g0", "g0"]
    assert [m.device_index for m in fit.mig] == [0, 1, 2]
    assert [m.placement.start for m in fit.mig] == [6, 5, 4]


def test_more_instances_than_free_placements_is_rejected_with_hamis_counts() -> None:
    # one free 1g placement (slice 6): the first instance is granted, the retry on the same card is not
    card0 = mig_card("g0", *(("1g.5gb", s) for s in range(6)), count=8)
    fit = fit_container([card0], mib(2, 4000), ctx(node("n", card0)))
    assert not fit.fits
    assert fit.rejected == {Reason.CARD_MIG_TOPOLOGY_INFEASIBLE: 1, Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: 1}


def test_hami_core_pods_never_land_on_mig_cards_and_mig_pods_never_on_shared_ones() -> None:
    shared = card("core", index=1, totalmem=40960, count=10, type=MODEL)
    cards = [mig_card("mig"), shared]
    n = node("n", *cards)
    assert [d.uuid for d in fit_container(cards, mib(1, 4000), ctx(n, vgpu_mode="hami-core")).devices] == ["core"]
    mig_fit = fit_container(cards, mib(1, 4000), ctx(n, vgpu_mode="mig"))
    assert [d.uuid for d in mig_fit.devices] == ["mig"]
    assert len(mig_fit.mig) == 1
    # a hami-core pod may not count on a MIG card holding several of its slices
    assert fit_container(cards, mib(3, 4000), ctx(n, vgpu_mode="hami-core")).rejected == {
        Reason.NODE_INSUFFICIENT_DEVICE: 1
    }


def test_binpack_packs_onto_the_partly_cut_card_and_spread_picks_the_empty_one() -> None:
    cut = mig_card("cut", ("2g.10gb", 4))
    empty = mig_card("empty", index=1)
    n = node("n", cut, empty)
    binpack = fit_container(n.devices, mib(1, 4000), ctx(n, gpu_policy="binpack"))
    spread = fit_container(n.devices, mib(1, 4000), ctx(n, gpu_policy="spread"))
    assert [d.uuid for d in binpack.devices] == ["cut"]
    assert binpack.mig[0].placement == MigPlacement(start=6, size=1)
    assert [d.uuid for d in spread.devices] == ["empty"]


def test_a_pods_containers_get_distinct_instances_and_reservations_name_their_container() -> None:
    n = node("n", mig_card())
    fit = fit_node(n, pod(None, mib(1, 4000), mib(1, 9000)), PodPreferences())
    assert fit.fits
    assert [(m.container_index, m.device_index, m.profile, m.placement.start) for m in fit.mig] == [
        (1, 0, "1g.5gb", 6),
        (2, 0, "2g.10gb", 4),
    ]
    # the booking carries both instances on the card, so the next pod cannot overlap them
    after = apply_charges(n, fit.charges)
    assert sorted(i.placement.start for i in after.devices[0].mig_instances) == [4, 6]
    assert (after.devices[0].used, after.devices[0].usedmem) == (2, 4864 + 9856)
    nxt = fit_node(after, pod(mib(1, 9000)), PodPreferences())
    assert nxt.mig[0].placement == MigPlacement(start=0, size=2)


def test_an_init_containers_instance_is_not_overlapped_by_an_app_containers() -> None:
    n = node("n", mig_card())
    fit = fit_node(n, pod(mib(1, 4000), init=(mib(1, 4000),)), PodPreferences())
    assert [(m.container_index, m.placement.start) for m in fit.mig] == [(0, 6), (1, 5)]


def test_releasing_a_booking_frees_its_placements() -> None:
    n = node("n", mig_card())
    fit = fit_node(n, pod(mib(1, 30000)), PodPreferences())
    assert fit.mig[0].profile == "7g.40gb"
    full = apply_charges(n, fit.charges)
    assert not fit_node(full, pod(mib(1, 1000)), PodPreferences()).fits
    freed = apply_charges(full, fit.charges, -1)
    assert freed == n


def test_preempting_the_pod_on_a_mig_card_frees_its_placement_for_the_preemptor() -> None:
    n = node("n", mig_card())
    victim_fit = fit_node(n, pod(mib(1, 30000)), PodPreferences())
    victim = Candidate(uid="v", priority=10, charges=victim_fit.charges)
    usage = apply_charges(n, victim.charges)
    choice = choose_victims(usage, pod(mib(1, 15000)), PodPreferences(), [victim], preemptor_priority=1000)
    assert choice is not None
    assert [v.uid for v in choice.victims] == ["v"]
    assert choice.fit.mig[0].profile == "3g.20gb"


# --- HAMi's example values -------------------------------------------------------------------------------

HAMI_MIG_EXAMPLE = (
    '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-x","profile":"1g.10gb","placement":{"start":6,"size":1}}]'
)
HAMI_COMPACT_PROFILE = '{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":[{"start":6,"size":1}]}'


def test_hamis_mig_reservation_example_round_trips() -> None:
    decoded = decode_mig_allocations(HAMI_MIG_EXAMPLE)
    assert decoded[0].placement == MigPlacement(start=6, size=1)
    assert not decoded[0].realised
    assert encode_mig_allocations(decoded) == HAMI_MIG_EXAMPLE


def test_a_card_registered_with_hamis_compact_profile_gets_the_reservation_hami_writes() -> None:
    registration = (
        '[{"id":"id-1","index":1,"count":1,"devmem":1024,"devcore":10,"type":"NVIDIA","mode":"mig",'
        f'"migProfiles":[{HAMI_COMPACT_PROFILE}],"health":true}}]'
    )
    infos = decode_node_devices(registration)
    assert encode_node_devices(infos) == registration
    assert msgspec.json.encode(infos[0].mig_profiles[0]).decode() == HAMI_COMPACT_PROFILE
    n = NodeUsage(name="n", devices=(device_usage_from(infos[0]),))
    fit = fit_node(n, pod(mib(1, 1000)), PodPreferences())
    assert fit.grants[0][0].usedmem == 4864
    assert fit.grants[0][0].usedcores == 15
    assert encode_mig_allocations(fit.mig) == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"id-1","profile":"1g.5gb","placement":{"start":6,"size":1}}]'
    )
