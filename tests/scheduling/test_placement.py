"""Whole-pod fitting and node choice (hami-protocol §4.4-4.5, §8 cases 19-21)."""

from __future__ import annotations

import pytest

from hami_common.annotations.devices import ContainerDevice
from hami_common.scheduling import (
    DeviceUsage,
    NodeFit,
    NodePolicy,
    NodeUsage,
    PodPreferences,
    Reason,
    choose_node,
    fit_node,
    unregistered,
)
from tests.scheduling.builders import card, mib, node, pod


def gpu(id: str, **kw: int) -> DeviceUsage:
    return card(id, count=10, totalmem=8000, totalcore=100, type="NVIDIA-Tesla V100", **kw)


def test_node_score_of_an_idle_node_is_zero() -> None:
    fit = fit_node(node("node1", card("uuid1", count=10, totalmem=8000)), pod(mib(1, 1000)), PodPreferences())
    assert (fit.fits, fit.score) == (True, 0.0)


def test_node_score_of_a_half_used_card_is_fifteen() -> None:
    half = card("uuid1", count=10, used=5, totalmem=8000, usedmem=4000, usedcores=50)
    assert fit_node(node("node1", half), pod(mib(1, 1000)), PodPreferences()).score == 15.0


def test_spread_picks_the_idle_card_of_a_node_scoring_seven_and_a_half() -> None:
    idle = card("uuid1", count=10, totalmem=8000)
    half = card("uuid2", count=10, used=5, totalmem=8000, usedmem=4000, usedcores=50)
    fit = fit_node(node("node1", idle, half), pod(mib(1, 1000)), PodPreferences(gpu_policy="spread"))
    assert fit.score == 7.5
    assert [d.uuid for d in fit.grants[0]] == ["uuid1"]


def test_a_card_smaller_than_the_request_fails_the_node_with_hamis_reason() -> None:
    fit = fit_node(node("node1", card("uuid1", totalmem=50)), pod(mib(1, 1000)), PodPreferences())
    assert (fit.fits, fit.reason) == (False, "1/1 CardInsufficientMemory")


def test_more_cards_asked_than_the_node_has_is_node_insufficient_device() -> None:
    fit = fit_node(node("node1", card("uuid1")), pod(mib(2, 10)), PodPreferences())
    assert fit.reason == "NodeInsufficientDevice"


def test_unregistered_node_is_unresolvable() -> None:
    fit = unregistered("ghost")
    assert (fit.fits, fit.reason, fit.unresolvable) == (False, "node unregistered", True)


def cluster() -> list[NodeUsage]:
    # HAMi: pkg/scheduler/scheduler_test.go (Filter): node1 has device1 in use, node2 has device4 in use.
    return [
        node("node1", gpu("device1", used=1, usedcores=25, usedmem=2000), gpu("device2")),
        node("node2", gpu("device3"), gpu("device4", used=1, usedcores=75, usedmem=6000)),
    ]


@pytest.mark.parametrize(
    ("node_policy", "gpu_policy", "want_node", "want_card"),
    [
        pytest.param(
            NodePolicy.BINPACK, "binpack", "node2", "device4", id="binpack-binpack packs onto the busiest card"
        ),
        pytest.param(
            NodePolicy.SPREAD,
            "binpack",
            "node1",
            "device1",
            id="spread-binpack picks the idler node and its busier card",
        ),
        pytest.param(
            NodePolicy.SPREAD, "spread", "node1", "device2", id="spread-spread picks the idle card of the idler node"
        ),
    ],
)
def test_filter_end_to_end_choices_match_hami(
    node_policy: NodePolicy, gpu_policy: str, want_node: str, want_card: str
) -> None:
    prefs = PodPreferences(node_policy=node_policy, gpu_policy=gpu_policy)
    fits = [fit_node(n, pod(mib(1, 1000, cores=20)), prefs) for n in cluster()]
    chosen = choose_node(fits, node_policy)
    assert chosen is not None
    assert (chosen.node, chosen.grants[0][0].uuid) == (want_node, want_card)
    assert chosen.grants[0][0] == ContainerDevice(uuid=want_card, type="NVIDIA", usedmem=1000, usedcores=20)


def test_node_ties_go_to_the_node_listed_last() -> None:
    fits = [NodeFit(node="a", score=1.0), NodeFit(node="b", score=1.0), NodeFit(node="c", score=0.5)]
    assert choose_node(fits, NodePolicy.BINPACK).node == "b"  # type: ignore[union-attr]
    assert choose_node(fits, NodePolicy.SPREAD).node == "c"  # type: ignore[union-attr]


def test_choose_node_returns_none_when_nothing_fits() -> None:
    assert choose_node([NodeFit(node="a", rejected={Reason.CARD_NOT_HEALTH: 1}, checked=1)], NodePolicy.SPREAD) is None


def topology_node(scores: dict[str, dict[str, int]]) -> NodeUsage:
    return node("n", *(card(u, index=i) for i, u in enumerate("abcdef")), pair_scores=scores)


def test_topology_aware_picks_the_best_connected_three_cards() -> None:
    scores = {u: {v: 1 for v in "abcdef" if v != u} for u in "abcdef"}
    for a, b in (("f", "a"), ("f", "c")):
        scores[a][b] = scores[b][a] = 100
    fit = fit_node(topology_node(scores), pod(mib(3, 10)), PodPreferences(gpu_policy="topology-aware"))
    assert [d.uuid for d in fit.grants[0]] == ["f", "c", "a"]


def test_topology_aware_gives_a_single_card_request_the_worst_connected_card() -> None:
    scores = {u: {v: 100 for v in "abcdef" if v != u} for u in "abcdef"}
    for other in "abcde":
        scores["f"][other] = scores[other]["f"] = 1
    fit = fit_node(topology_node(scores), pod(mib(1, 10)), PodPreferences(gpu_policy="topology-aware"))
    assert [d.uuid for d in fit.grants[0]] == ["f"]


def test_app_containers_accumulate_on_the_same_node() -> None:
    n = node("n", card("only", totalmem=1000))
    assert fit_node(n, pod(mib(1, 600), mib(1, 400)), PodPreferences()).fits
    assert fit_node(n, pod(mib(1, 600), mib(1, 500)), PodPreferences()).reason == "1/1 CardInsufficientMemory"


def test_init_containers_are_fitted_independently_of_each_other_and_of_app_containers() -> None:
    n = node("n", card("only", totalmem=1000))
    fit = fit_node(n, pod(mib(1, 900), init=(mib(1, 800), mib(1, 1000))), PodPreferences())
    assert fit.fits
    assert [len(c) for c in fit.grants] == [1, 1, 1]
    assert [(c.usedmem, c.slots) for c in fit.charges] == [(1000, 1)]


def test_containers_without_gpu_get_empty_entries_in_order() -> None:
    fit = fit_node(node("n", card("g")), pod(None, mib(1, 10), init=(None,)), PodPreferences())
    assert [len(c) for c in fit.grants] == [0, 0, 1]
