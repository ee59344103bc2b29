"""The FilteringSucceed Event counts every node kube-scheduler passed to /filter (hami-protocol §4.4 step 10).

The extender stops at the best node that fits, so it cannot list every node that would fit as HAMi does;
it counts the nodes it ruled out or fitted without success as "not fit" and those ranked below the chosen
one as "not tried", so the counts add up to the nodes given, whichever of them kube-scheduler kept. The
Event is recorded when the extender is asked for HAMi's success Events (``--success-events``)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest

from hami_common import subjects
from hami_common.annotations import NODE_SCHEDULER_POLICY
from hami_common.bus import Bus, Delivery
from hami_common.events import FilterRefusal
from hami_common.scheduling import Reason
from hami_extender.notices import FILTERING_SUCCEED
from hami_extender.settings import ExtenderSettings
from hami_sim.kubeapi import KubeApiEmulator, parse_field_selector, parse_label_selector
from hami_sim.waiting import eventually
from tests.extender.cluster import EVENTS, add_node, add_pod, cards, gpu_container
from tests.extender.conftest import Served

SUCCESS = re.compile(
    r"find fit node\((?P<node>[^)]+)\), (?P<not_fit>\d+) nodes not fit, 1 nodes fit\((?P=node):[0-9.]+\)"
    r"(, (?P<untried>\d+) nodes not tried)?"
)


@pytest.fixture
def settings(settings: ExtenderSettings) -> ExtenderSettings:
    return dataclasses.replace(settings, success_events=True)


async def success_message(emulator: KubeApiEmulator, pod: str) -> re.Match[str]:
    def found() -> str | None:
        everything = parse_label_selector(""), parse_field_selector("", lambda _: True)
        items, _ = emulator.store.list_matching(EVENTS, "default", *everything)
        messages = [
            e["message"] for e in items if e["reason"] == FILTERING_SUCCEED and e["involvedObject"]["name"] == pod
        ]
        return messages[0] if messages else None

    message = await eventually(found, timeout=10, what=f"the FilteringSucceed event of {pod}")
    matched = SUCCESS.fullmatch(message)
    assert matched is not None, message
    return matched


def counted(matched: re.Match[str]) -> int:
    return int(matched["not_fit"]) + 1 + int(matched["untried"] or 0)


async def registered(emulator: KubeApiEmulator, extender: Served, nodes: dict[str, list[Any]]) -> None:
    for name, devices in nodes.items():
        add_node(emulator, name, devices)
    await eventually(lambda: all(name in extender.state["ledger"] for name in nodes))


async def test_every_node_given_is_counted_when_the_first_one_tried_fits(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    names = [f"node{i}" for i in range(1, 6)]
    await registered(emulator, extender, {name: cards(name) for name in names})
    answer = await extender.filter(add_pod(emulator, "fits"), names)
    (chosen,) = answer["NodeNames"]
    matched = await success_message(emulator, "fits")
    assert matched["node"] == chosen
    assert (int(matched["not_fit"]), int(matched["untried"])) == (0, 4)  # was "0 nodes not fit, 1 nodes fit"
    assert counted(matched) == len(names)


async def test_unregistered_and_too_small_nodes_count_as_not_fit(emulator: KubeApiEmulator, extender: Served) -> None:
    small = {f"a{i}": cards(f"a{i}", devmem=1000) for i in range(1, 4)}  # spread tries them first: names sort first
    await registered(emulator, extender, {**small, "z-big": cards("z-big")})
    given = ["ghost", *small, "z-big"]  # kube-scheduler's own filters may pass a node the extender never saw
    pod = add_pod(
        emulator,
        "needs-big",
        containers=[gpu_container(mem=5000)],
        annotations={NODE_SCHEDULER_POLICY: "spread"},
    )
    assert (await extender.filter(pod, given))["NodeNames"] == ["z-big"]
    matched = await success_message(emulator, "needs-big")
    assert (matched["node"], int(matched["not_fit"]), matched["untried"]) == ("z-big", 4, None)
    assert counted(matched) == len(given)


async def test_a_subset_of_the_cluster_is_counted_as_given(emulator: KubeApiEmulator, extender: Served) -> None:
    names = [f"node{i}" for i in range(1, 6)]
    await registered(emulator, extender, {name: cards(name) for name in names})
    given = names[:2]  # kube-scheduler filtered the other three out before asking
    await extender.filter(add_pod(emulator, "subset"), given)
    assert counted(await success_message(emulator, "subset")) == len(given)


async def test_a_pod_no_node_fits_is_announced_with_its_reasons_counted(
    emulator: KubeApiEmulator, extender: Served, bus: Bus
) -> None:
    """The metrics service's page says why a pending pod waits from this message, not from Kubernetes events."""
    received: list[FilterRefusal] = []

    async def on_refusal(event: FilterRefusal, delivery: Delivery) -> None:
        assert delivery.subject == subjects.scheduling("default")
        received.append(event)

    await bus.subscribe(subjects.wildcard(subjects.SCHEDULING), FilterRefusal, on_refusal)
    small = {f"s{i}": cards(f"s{i}", devmem=1000) for i in range(1, 4)}
    await registered(emulator, extender, small)
    await eventually(lambda: extender.state["publisher"].bus is not None, what="the extender's bus")
    pod = add_pod(emulator, "too-big", containers=[gpu_container(mem=5000)])
    answer = await extender.filter(pod, ["ghost", *small])
    assert not answer["NodeNames"]
    await eventually(lambda: received, timeout=10, what="the refusal on hami.scheduling")
    (refusal,) = received
    assert (refusal.pod_uid, refusal.namespace, refusal.name) == (pod["metadata"]["uid"], "default", "too-big")
    assert refusal.nodes == 4
    # every small node refuses each of its cards for memory; the node it never saw is unregistered
    counted_reasons = {r.reason: r.nodes for r in refusal.reasons}
    assert counted_reasons == {Reason.CARD_INSUFFICIENT_MEMORY: 3, Reason.NODE_UNREGISTERED: 1}
    assert refusal.reasons[0].reason == Reason.CARD_INSUFFICIENT_MEMORY  # most frequent first
