"""Card and node scores and the card ordering, in float32 (hami-protocol §4.5-4.6, §8 cases 15-18)."""

from __future__ import annotations

import pytest

from hami_common.scheduling import PodPreferences, ScoringWeights, device_score, f32, node_score, sort_devices
from hami_common.scheduling.usage import DeviceUsage
from tests.scheduling.builders import card, request


def test_card_score_without_a_matching_request_reflects_usage_only() -> None:
    dev = card("d", count=10, used=2, totalcore=4, usedcores=1, totalmem=8192, usedmem=2048, type="type1")
    assert device_score(dev, [request(type="NVIDIA")]) == 7.0


def test_card_score_includes_requests_of_the_same_type() -> None:
    dev = card("d", count=10, used=2, totalcore=4, usedcores=1, totalmem=8192, usedmem=2048, type="type1")
    assert device_score(dev, [request(memreq=1024, cores=1, type="type1")]) == 11.75


def test_card_score_resolves_a_memory_percentage_against_the_card() -> None:
    dev = card("d", count=10, totalcore=10, totalmem=8192, type="type1")
    assert device_score(dev, [request(memreq=0, pct=50, cores=2, type="type1")]) == 8.0


def test_card_score_is_zero_when_a_total_is_zero() -> None:
    assert device_score(card("d", count=0), []) == 0.0


A = card("A", count=10, used=1, totalcore=100, usedcores=90, totalmem=100, usedmem=10)
B = card("B", count=10, used=7, totalcore=100, usedcores=10, totalmem=100, usedmem=20)


@pytest.mark.parametrize(
    ("weights", "want_a", "want_b"),
    [
        pytest.param(ScoringWeights(1, 1, 1), 16.0, 15.0, id="equal weights keep the classic score"),
        pytest.param(ScoringWeights(1, 1, 3), 26.0, 27.0, id="a heavy memory weight favours the fuller memory"),
        pytest.param(ScoringWeights(1, 3, 1), 34.0, 17.0, id="a heavy core weight favours the busier cores"),
    ],
)
def test_weighted_card_scores_match_hami(weights: ScoringWeights, want_a: float, want_b: float) -> None:
    req = request(memreq=0, pct=40)
    assert (device_score(A, [req], weights), device_score(B, [req], weights)) == (want_a, want_b)


def test_memory_weight_flips_binpack_and_spread_choices() -> None:
    req = request(memreq=0, pct=40)
    w = ScoringWeights(1, 1, 3)
    scored = [(A, device_score(A, [req], w)), (B, device_score(B, [req], w))]
    assert sort_devices(scored, PodPreferences(gpu_policy="binpack"))[-1].id == "B"
    assert sort_devices(scored, PodPreferences(gpu_policy="spread"))[-1].id == "A"


def test_node_default_score_sums_three_used_fractions() -> None:
    devices = [
        card("a", count=100, used=50, totalcore=100, usedcores=100, totalmem=100, usedmem=100),
        card("b", count=150, used=75, totalcore=200, usedcores=200, totalmem=200, usedmem=200),
    ]
    assert node_score(devices) == 25.0


def test_scores_round_like_go_float32() -> None:
    dev = card("d", count=10, used=1, totalcore=10, usedcores=2, totalmem=10, usedmem=0)
    assert 10 * (1 / 10 + 2 / 10 + 0 / 10) != 3.0  # double precision leaves a remainder
    assert device_score(dev, []) == f32(10.0 * f32(f32(0.1) + f32(0.2))) == 3.0


def order(devices: list[tuple[DeviceUsage, float]], policy: str, numa_bind: bool = False) -> list[str]:
    return [d.id for d in sort_devices(devices, PodPreferences(gpu_policy=policy, numa_bind=numa_bind))]


N0_LOW = (card("n0-low", numa=0, index=0), 1.0)
N0_HIGH = (card("n0-high", numa=0, index=1), 5.0)
N1_LOW = (card("n1-low", numa=1, index=2), 2.0)
N1_HIGH = (card("n1-high", numa=1, index=3), 9.0)
ALL = [N1_HIGH, N0_LOW, N1_LOW, N0_HIGH]


@pytest.mark.parametrize(
    ("policy", "numa_bind", "want"),
    [
        pytest.param("binpack", False, ["n0-low", "n1-low", "n0-high", "n1-high"], id="binpack sorts score ascending"),
        pytest.param("spread", False, ["n1-high", "n0-high", "n1-low", "n0-low"], id="spread sorts score descending"),
        pytest.param(
            "topology-aware",
            False,
            ["n1-high", "n0-high", "n1-low", "n0-low"],
            id="a bare topology-aware sorts like spread",
        ),
        pytest.param(
            "binpack",
            True,
            ["n1-low", "n1-high", "n0-low", "n0-high"],
            id="binpack with numa-bind puts NUMA 1 before NUMA 0 regardless of score",
        ),
        pytest.param(
            "spread",
            True,
            ["n0-high", "n0-low", "n1-high", "n1-low"],
            id="spread with numa-bind sorts NUMA ascending then score descending",
        ),
        pytest.param(
            "numa",
            False,
            ["n0-high", "n0-low", "n1-high", "n1-low"],
            id="a bare numa chain sorts NUMA first then spreads",
        ),
        pytest.param(
            "binpack,numa",
            False,
            ["n0-low", "n1-low", "n0-high", "n1-high"],
            id="a binpack,numa chain sorts by score first",
        ),
        pytest.param(
            "numa,spread",
            False,
            ["n0-high", "n0-low", "n1-high", "n1-low"],
            id="a numa,spread chain sorts by NUMA then score descending",
        ),
    ],
)
def test_card_order_follows_the_gpu_policy(policy: str, numa_bind: bool, want: list[str]) -> None:
    assert order(ALL, policy, numa_bind) == want


def test_chain_breaks_ties_by_card_index() -> None:
    a, b = (card("b", index=1), 1.0), (card("a", index=0), 1.0)
    assert order([a, b], "binpack,numa") == ["a", "b"]


def test_mutex_order_puts_idle_cards_last() -> None:
    busy, idle = (card("busy", used=2), 0.0), (card("idle", used=0), 0.0)
    assert order([idle, busy], "mutex") == ["busy", "idle"]
