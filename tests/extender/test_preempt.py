"""``POST /preempt``: the victims kube-scheduler's preemption cannot find for GPU slices, chosen by the extender
over its ledger, in kube-scheduler's wire form (k8s-interfaces §2.1), against the API emulator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hami_common.kube import Pod
from hami_sim.kubeapi import KubeApiEmulator, find_resource
from hami_sim.waiting import eventually
from tests.extender.cluster import PODS, add_node, cards, ensure_namespace, gpu_container
from tests.extender.conftest import Served

LOW, HIGH = 10, 1000
PDBS = find_resource("policy", "v1", "poddisruptionbudgets")
_UNSEEN = Pod()


async def _running(
    emulator: KubeApiEmulator,
    extender: Served,
    name: str,
    mem: int,
    priority: int,
    labels: dict[str, str] | None = None,
) -> str:
    """A pod placed on node one (its booking in the ledger), of the given PriorityClass value."""
    ensure_namespace(emulator, "default")
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels or {}},
        "spec": {"schedulerName": "hami-scheduler", "priority": priority, "containers": [gpu_container(mem=mem)]},
    }
    pod: dict[str, Any] = emulator.store.create(PODS, "default", body)
    # Filter books its cards (the ledger holds it from then on); a bind would only take the node's hand-off
    assert (await extender.filter(pod, ["one"]))["NodeNames"] == ["one"]
    binder = extender.state["binder"]
    await eventually(lambda: (binder.cached_pod("default", name) or _UNSEEN).metadata.uid == pod["metadata"]["uid"])
    uid: str = pod["metadata"]["uid"]
    return uid


def _preemptor(priority: int = HIGH, mem: int = 4000) -> dict[str, Any]:
    return {
        "metadata": {"name": "urgent", "namespace": "default", "uid": "uid-urgent"},
        "spec": {"schedulerName": "hami-scheduler", "priority": priority, "containers": [gpu_container(mem=mem)]},
        "status": {},
    }


async def _preempt(extender: Served, pod: dict[str, Any], nodes: list[str], meta: bool = True) -> dict[str, Any]:
    victims = {"Pods": [], "NumPDBViolations": 0}
    key = "NodeNameToMetaVictims" if meta else "NodeNameToVictims"
    response = await extender.client.post("/preempt", json={"Pod": pod, key: dict.fromkeys(nodes, victims)})
    assert response.status_code == 200
    answer: dict[str, Any] = response.json()
    return answer


@pytest.fixture
async def full_card(emulator: KubeApiEmulator, extender: Served) -> dict[str, str]:
    """Node one: one 8000 MiB card holding 2000 + 5000 MiB of low-priority pods; node two is full of peers."""
    add_node(emulator, "one", cards("one", n=1, devmem=8000))
    await eventually(lambda: "one" in extender.state["ledger"])
    return {
        "small": await _running(emulator, extender, "small", 2000, LOW),
        "big": await _running(emulator, extender, "big", 5000, LOW),
    }


async def test_the_golden_request_decodes_and_an_unknown_node_gets_no_victims(
    extender: Served, shared_fixtures: Path
) -> None:
    golden = shared_fixtures / "k8s" / "extender.v1.ExtenderPreemptionArgs.golden.json"
    body = json.loads(golden.read_bytes())
    response = await extender.client.post("/preempt", json=body)
    assert response.status_code == 200
    assert response.json() == {"NodeNameToMetaVictims": {}}


async def test_the_smallest_set_of_lower_priority_pods_is_returned_in_meta_form(
    extender: Served, full_card: dict[str, str]
) -> None:
    answer = await _preempt(extender, _preemptor(mem=4000), ["one"])
    assert answer == {"NodeNameToMetaVictims": {"one": {"Pods": [{"UID": full_card["big"]}], "NumPDBViolations": 0}}}
    # without a node cache kube-scheduler sends full victims; the answer is the meta form all the same
    assert await _preempt(extender, _preemptor(mem=4000), ["one"], meta=False) == answer


async def test_equal_priority_is_never_preempted(extender: Served, full_card: dict[str, str]) -> None:
    del full_card
    assert await _preempt(extender, _preemptor(priority=LOW), ["one"]) == {"NodeNameToMetaVictims": {}}


async def test_a_pod_that_fits_without_victims_or_never_fits_gets_no_candidate(
    extender: Served, full_card: dict[str, str]
) -> None:
    del full_card
    assert await _preempt(extender, _preemptor(mem=1000), ["one"]) == {"NodeNameToMetaVictims": {}}
    assert await _preempt(extender, _preemptor(mem=9000), ["one"]) == {"NodeNameToMetaVictims": {}}


async def test_a_pdb_protected_pod_is_spared_when_another_victim_works(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    add_node(emulator, "one", cards("one", n=1, devmem=8000))
    await eventually(lambda: "one" in extender.state["ledger"])
    # the guarded pod is the cheaper victim (lower priority), but a budget allows it no disruption
    guarded = await _running(emulator, extender, "guarded", 4000, LOW, labels={"app": "guarded"})
    other = await _running(emulator, extender, "other", 4000, LOW + 5)
    assert PDBS is not None
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "keep-guarded", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "guarded"}}},
        "status": {"disruptionsAllowed": 0},
    }
    emulator.store.create(PDBS, "default", budget)
    answer = await _preempt(extender, _preemptor(mem=4000), ["one"])
    assert answer == {"NodeNameToMetaVictims": {"one": {"Pods": [{"UID": other}], "NumPDBViolations": 0}}}
    # when only the guarded pod would do, it is offered, with the violation counted
    answer = await _preempt(extender, _preemptor(mem=8000), ["one"])
    victims = answer["NodeNameToMetaVictims"]["one"]
    assert sorted(p["UID"] for p in victims["Pods"]) == sorted([guarded, other])
    assert victims["NumPDBViolations"] == 1


async def test_the_node_a_preemptor_was_nominated_to_is_kept_for_it(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    add_node(emulator, "one", cards("one", n=1, devmem=8000))
    await eventually(lambda: "one" in extender.state["ledger"])
    ensure_namespace(emulator, "default")
    emulator.store.create(PODS, "default", {**_preemptor(mem=6000), "status": {}})

    def nominate(pod: dict[str, Any]) -> dict[str, Any]:
        pod["status"]["nominatedNodeName"] = "one"  # as kube-scheduler writes it after preempting
        return pod

    emulator.store.update(PODS, "default", "urgent", nominate, "status")
    placer = extender.state["placer"]
    await eventually(lambda: placer.nominations.ahead_of("one", "someone", LOW))

    def pod(name: str, mem: int, priority: int) -> dict[str, Any]:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": "hami-scheduler", "priority": priority, "containers": [gpu_container(mem=mem)]},
        }
        created: dict[str, Any] = emulator.store.create(PODS, "default", body)
        return created

    # a less important pod gets only what the nominee leaves: 2000 of 8000 MiB
    behind = await extender.filter(pod("behind", 4000, LOW), ["one"])
    assert behind["NodeNames"] is None
    assert behind["FailedNodes"] == {"one": "1/1 CardInsufficientMemory"}
    assert (await extender.filter(pod("small", 2000, LOW), ["one"]))["NodeNames"] == ["one"]
    # a more important pod is not held back by it (kube-scheduler would preempt again for that one)
    assert (await extender.filter(pod("vip", 4000, HIGH + 1), ["one"]))["NodeNames"] == ["one"]

    # once the nominee is bound, the nomination holds nothing any more
    def assign(pod: dict[str, Any]) -> dict[str, Any]:
        pod["spec"]["nodeName"] = "one"
        return pod

    emulator.store.bind(PODS, "default", "urgent", assign)
    await eventually(lambda: not placer.nominations.ahead_of("one", "someone", LOW))
