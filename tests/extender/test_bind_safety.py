"""A /bind that fails, or that names a pod it should not, never drops the booking of a running pod, and the
extender binds only pods of its own scheduler (issue 16, items 2 and 3).

Each case has a victim bound to the one 8000 MiB card with 6000 MiB; a probe asking for 4000 MiB is filtered
before and after the hostile bind and must be rejected both times: had the victim's booking been dropped,
the probe would be placed on the same card (double booking)."""

from __future__ import annotations

from typing import Any

from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.waiting import eventually
from tests.extender.cluster import PODS, add_node, add_pod, cards, ensure_namespace, gpu_container
from tests.extender.conftest import Served

CARD_FULL = {"one": "1/1 CardInsufficientMemory"}


async def _victim_and_probe(emulator: KubeApiEmulator, extender: Served) -> tuple[dict[str, Any], dict[str, Any]]:
    add_node(emulator, "one", cards("one", n=1, devmem=8000))
    add_node(emulator, "two", cards("two", n=1, devmem=8000))
    await eventually(lambda: "one" in extender.state["ledger"] and "two" in extender.state["ledger"])
    victim = add_pod(emulator, "victim", containers=[gpu_container(mem=6000)])
    assert (await extender.filter(victim, ["one"]))["NodeNames"] == ["one"]
    assert await extender.bind(victim, "one") == {"Error": ""}
    binder = extender.state["binder"]
    # the extender's own watch has seen the bind: the cases below meet the pod as the running pod it is
    await eventually(lambda: binder.cached_pod("default", "victim").spec.node_name == "one")
    probe = add_pod(emulator, "probe", containers=[gpu_container(mem=4000)])
    before = await extender.filter(probe, ["one"])
    assert (before["NodeNames"], before["FailedNodes"]) == (None, CARD_FULL)
    return victim, probe


async def _still_booked(
    emulator: KubeApiEmulator, extender: Served, victim: dict[str, Any], probe: dict[str, Any]
) -> None:
    assert emulator.store.get(PODS, "default", "victim")["spec"]["nodeName"] == "one"
    after = await extender.filter(probe, ["one"])
    assert (after["NodeNames"], after["FailedNodes"]) == (None, CARD_FULL), "the victim's 6000 MiB were released"
    assert extender.state["ledger"].booking(victim["metadata"]["uid"]) is not None


async def _raw_bind(extender: Served, name: str, uid: str, node: str) -> str:
    body = {"PodName": name, "PodNamespace": "default", "PodUID": uid, "Node": node}
    response = await extender.client.post("/bind", json=body)
    assert response.status_code == 200
    error: str = response.json()["Error"]
    return error


async def test_a_bind_naming_a_missing_pod_with_a_running_pods_uid_releases_nothing(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    victim, probe = await _victim_and_probe(emulator, extender)
    error = await _raw_bind(extender, "ghost", victim["metadata"]["uid"], "one")
    assert "ghost" in error
    await _still_booked(emulator, extender, victim, probe)


async def test_a_bind_of_a_bound_pod_to_another_node_is_refused_and_releases_nothing(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    victim, probe = await _victim_and_probe(emulator, extender)
    error = await _raw_bind(extender, "victim", victim["metadata"]["uid"], "two")
    await _still_booked(emulator, extender, victim, probe)
    assert "already bound to one" in error
    assert extender.state["binder"].handoff.holder("one").uid == victim["metadata"]["uid"]  # its hand-off stands


async def test_a_repeated_bind_to_the_same_node_succeeds_and_releases_nothing(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    victim, probe = await _victim_and_probe(emulator, extender)
    result = await extender.bind(victim, "one")
    await _still_booked(emulator, extender, victim, probe)
    assert result == {"Error": ""}  # the pod is where it was asked to be: nothing failed
    assert extender.state["binder"].handoff.holder("one").uid == victim["metadata"]["uid"]


async def test_a_repeated_bind_racing_the_watch_succeeds_and_releases_nothing(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    """The second bind comes at once: the extender's cache may not show the first yet, and the apiserver
    answers 409; the pod read back is bound where asked, so nothing failed and nothing is released."""
    add_node(emulator, "one", cards("one", n=1, devmem=8000))
    await eventually(lambda: "one" in extender.state["ledger"])
    victim = add_pod(emulator, "victim", containers=[gpu_container(mem=6000)])
    assert (await extender.filter(victim, ["one"]))["NodeNames"] == ["one"]
    assert await extender.bind(victim, "one") == {"Error": ""}
    assert await extender.bind(victim, "one") == {"Error": ""}
    probe = add_pod(emulator, "probe", containers=[gpu_container(mem=4000)])
    after = await extender.filter(probe, ["one"])
    assert (after["NodeNames"], after["FailedNodes"]) == (None, CARD_FULL)
    assert extender.state["binder"].handoff.holder("one").uid == victim["metadata"]["uid"]


async def test_a_bind_of_another_schedulers_pod_is_refused_and_the_pod_stays_unbound(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    """HAMi#3030: whoever reached /bind bound any pod, even a CPU pod of another namespace."""
    ensure_namespace(emulator, "shop")
    web = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"schedulerName": "default-scheduler", "containers": [{"name": "c", "image": "nginx"}]},
    }
    pod = emulator.store.create(PODS, "shop", web)
    body = {"PodName": "web", "PodNamespace": "shop", "PodUID": pod["metadata"]["uid"], "Node": "one"}
    response = await extender.client.post("/bind", json=body)
    assert response.status_code == 200
    assert "schedulerName 'default-scheduler', not 'hami-scheduler'" in response.json()["Error"]
    assert not emulator.store.get(PODS, "shop", "web")["spec"].get("nodeName")
