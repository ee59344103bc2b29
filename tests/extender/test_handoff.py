"""The node hand-off and placements on NATS (ARCHITECTURE §3): holds end on the allocation result, the
pod's deletion or a failed bind; binds to different nodes never wait on each other."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from hami_common import subjects
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    NODE_PLACEMENTS,
    NODE_PLACEMENTS_BUS,
    TRACE_CONTEXT,
    VGPU_NODE,
    decode_pod_devices,
)
from hami_common.bus import Bus, Delivery
from hami_common.events import AllocationResult, PlacementDecision
from hami_common.kube import KubeClient
from hami_extender.settings import ExtenderSettings
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.waiting import eventually
from tests.extender.cluster import NODES, PODS, add_node, add_pod, gpu_container, pod_annotations
from tests.extender.conftest import Served

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def placed(emulator: KubeApiEmulator, extender: Served, name: str, node: str, **kw: Any) -> dict[str, Any]:
    pod = add_pod(emulator, name, **kw)
    result = await extender.filter(pod, [node])
    assert result["NodeNames"] == [node], result
    return pod


def allocation(pod: dict[str, Any], node: str, ok: bool = True) -> AllocationResult:
    meta = pod["metadata"]
    return AllocationResult(
        pod_uid=meta["uid"],
        namespace=meta["namespace"],
        name=meta["name"],
        node=node,
        container="main",
        ok=ok,
        staged=True,
        at_ns=time.time_ns(),
    )


def lock_of(emulator: KubeApiEmulator, node: str) -> str | None:
    value: str | None = (emulator.store.get(NODES, None, node)["metadata"].get("annotations") or {}).get(NODE_LOCK)
    return value


async def test_bind_publishes_the_placement_with_the_pods_trace(
    emulator: KubeApiEmulator, extender: Served, bus: Bus
) -> None:
    add_node(emulator, "node1")
    await eventually(lambda: "node1" in extender.state["ledger"])
    got: asyncio.Queue[tuple[PlacementDecision, Delivery]] = asyncio.Queue()

    async def on_placement(event: PlacementDecision, delivery: Delivery) -> None:
        await got.put((event, delivery))

    await bus.subscribe(subjects.placement("node1"), PlacementDecision, on_placement)
    await eventually(lambda: extender.state["publisher"].bus is not None)
    pod = await placed(emulator, extender, "p1", "node1", annotations={TRACE_CONTEXT: TRACEPARENT})
    assert await extender.bind(pod, "node1") == {"Error": ""}
    decision, delivery = await asyncio.wait_for(got.get(), 5)
    assert (decision.pod_uid, decision.node, decision.name) == (pod["metadata"]["uid"], "node1", "p1")
    [container] = decision.containers
    assert (container.name, container.init, len(container.devices)) == ("main", False, 1)
    assert container.devices[0].usedmem_mib == 1000
    assert delivery.headers["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1]
    timings = (decision.filter_ns, decision.bind_ns, decision.handoff_wait_ns)
    assert all(t is not None and t > 0 for t in timings), timings  # the metrics service's latency histograms


async def test_a_lock_the_allocator_released_is_not_written_again(
    emulator: KubeApiEmulator, extender: Served, bus: Bus, settings: ExtenderSettings
) -> None:
    add_node(emulator, "node1")
    await eventually(lambda: "node1" in extender.state["ledger"])
    await eventually(lambda: extender.state["publisher"].bus is not None)
    pod = await placed(emulator, extender, "p1", "node1")
    assert await extender.bind(pod, "node1") == {"Error": ""}
    async with KubeClient.from_settings(settings.kube()) as kube:
        await kube.patch_node_annotations("node1", {NODE_LOCK: None})  # as HAMi's device plugin does
    binder = extender.state["binder"]
    await eventually(lambda: NODE_LOCK not in binder.cached_node("", "node1").metadata.annotations)
    node_path = "/api/v1/nodes/node1"
    before = emulator.count("GET", node_path), emulator.count("PATCH", node_path)
    await bus.publish(subjects.allocated("node1"), allocation(pod, "node1"))
    await eventually(lambda: binder.unlocks_handled == 1)
    assert binder.handoff.holder("node1") is None
    assert (emulator.count("GET", node_path), emulator.count("PATCH", node_path)) == before


async def test_allocation_result_on_the_bus_releases_the_node_for_the_next_bind(
    emulator: KubeApiEmulator, extender: Served, bus: Bus
) -> None:
    add_node(emulator, "node1")
    await eventually(lambda: "node1" in extender.state["ledger"])
    await eventually(lambda: extender.state["publisher"].bus is not None)
    first = await placed(emulator, extender, "first", "node1")
    second = await placed(emulator, extender, "second", "node1")
    assert await extender.bind(first, "node1") == {"Error": ""}
    assert lock_of(
        emulator,
        "node1",
    ).endswith(",default,first")  # type: ignore[union-attr]
    waiting = asyncio.create_task(extender.bind(second, "node1"))
    done, _ = await asyncio.wait({waiting}, timeout=0.3)
    assert not done  # the node is handed to "first" until its allocation is seen
    await bus.publish(subjects.allocated("node1"), allocation(first, "node1"))
    assert await asyncio.wait_for(waiting, 5) == {"Error": ""}
    await eventually(lambda: (lock_of(emulator, "node1") or "").endswith(",default,second"))


async def test_a_lock_whose_removal_met_an_apiserver_outage_is_removed_once_it_is_back(
    emulator: KubeApiEmulator, extender: Served, bus: Bus
) -> None:
    """Forgotten after one failed try, HAMi's lock stayed on the node and every later pod there waited out
    its 5-minute expiry (seen when the real kube-apiserver restarted mid-run)."""
    add_node(emulator, "node1")
    await eventually(lambda: "node1" in extender.state["ledger"])
    await eventually(lambda: extender.state["publisher"].bus is not None)
    pod = await placed(emulator, extender, "p1", "node1")
    assert await extender.bind(pod, "node1") == {"Error": ""}
    binder = extender.state["binder"]
    await eventually(lambda: NODE_LOCK in binder.cached_node("", "node1").metadata.annotations)
    emulator.stop()
    try:
        await bus.publish(subjects.allocated("node1"), allocation(pod, "node1"))
        await eventually(lambda: binder.unlock_failures >= 1, timeout=15)
    finally:
        emulator.start()
    await eventually(lambda: lock_of(emulator, "node1") is None, timeout=15, what="the lock removed after the outage")
    assert binder.handoff.holder("node1") is None


async def test_binds_to_different_nodes_never_wait_on_each_other(emulator: KubeApiEmulator, extender: Served) -> None:
    add_node(emulator, "node1")
    add_node(emulator, "node2")
    await eventually(lambda: "node1" in extender.state["ledger"] and "node2" in extender.state["ledger"])
    a = await placed(emulator, extender, "a", "node1")
    b = await placed(emulator, extender, "b", "node2")
    assert await extender.bind(a, "node1") == {"Error": ""}
    assert await asyncio.wait_for(extender.bind(b, "node2"), 2) == {"Error": ""}
    assert extender.state["binder"].handoff.holder("node1").uid == a["metadata"]["uid"]


async def test_pod_deletion_releases_its_hold_and_lock(emulator: KubeApiEmulator, extender: Served) -> None:
    add_node(emulator, "node1")
    await eventually(lambda: "node1" in extender.state["ledger"])
    pod = await placed(emulator, extender, "p1", "node1")
    assert await extender.bind(pod, "node1") == {"Error": ""}
    emulator.store.delete(PODS, "default", "p1")
    handoff = extender.state["binder"].handoff
    await eventually(lambda: handoff.holder("node1") is None and lock_of(emulator, "node1") is None)
    assert extender.state["ledger"].booking(pod["metadata"]["uid"]) is None


async def test_failed_bind_releases_the_hold_and_the_reservation(emulator: KubeApiEmulator, extender: Served) -> None:
    add_node(emulator, "node1")
    add_node(emulator, "node2")
    await eventually(lambda: "node2" in extender.state["ledger"] and "node1" in extender.state["ledger"])
    pod = await placed(emulator, extender, "p1", "node1")
    result = await extender.bind(pod, "node2")  # not the node Filter chose
    assert "was filtered to node1" in result["Error"]
    assert extender.state["binder"].handoff.holder("node1") is None
    assert extender.state["ledger"].booking(pod["metadata"]["uid"]) is None


async def test_a_refused_binds_placement_is_not_booked_back_by_the_pods_later_updates(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    """The pod still carries the placement Filter wrote; a later update of it (or the Filter's own patch,
    delivered after the refusal) must not book the cards again while the pod waits to be filtered anew."""
    add_node(emulator, "node1")
    add_node(emulator, "node2")
    await eventually(lambda: "node2" in extender.state["ledger"] and "node1" in extender.state["ledger"])
    pod = await placed(emulator, extender, "p1", "node1")
    uid = pod["metadata"]["uid"]
    assert "was filtered to node1" in (await extender.bind(pod, "node2"))["Error"]

    def touch(obj: dict[str, Any]) -> dict[str, Any]:
        obj["metadata"].setdefault("labels", {})["touched"] = "yes"
        return obj

    emulator.store.update(PODS, "default", "p1", touch)
    binder = extender.state["binder"]
    await eventually(lambda: binder.cached_pod("default", "p1").metadata.labels.get("touched") == "yes")
    assert extender.state["ledger"].booking(uid) is None
    view = extender.state["ledger"].view("node1")
    assert all(d.used == 0 for d in view.usage.devices)
    # filtered again, the pod books its cards anew
    again = await extender.filter(emulator.store.get(PODS, "default", "p1"), ["node1"])
    assert again["NodeNames"] == ["node1"]
    assert extender.state["ledger"].booking(uid).node == "node1"


async def test_a_hold_left_by_a_bind_of_unknown_outcome_ends_when_the_pod_binds_elsewhere(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    """A Binding whose answer was lost (apiserver restart) keeps the pod's hold on that node, as the pod may be
    bound there. When kube-scheduler retries the pod and binds it to another node, the first node is freed at
    once, not after HAMi's 5-minute expiry (which stalled every other bind to it)."""
    add_node(emulator, "node1")
    add_node(emulator, "node2")
    await eventually(lambda: "node1" in extender.state["ledger"] and "node2" in extender.state["ledger"])
    handoff = extender.state["binder"].handoff
    pod = await placed(emulator, extender, "p1", "node2")
    await handoff.acquire("node1", pod["metadata"]["uid"], "default", "p1", 1, 1.0)  # the doubtful bind's hold
    assert await extender.bind(pod, "node2") == {"Error": ""}
    assert handoff.holder("node1") is None
    assert handoff.holder("node2").uid == pod["metadata"]["uid"]
    other = await placed(emulator, extender, "p2", "node1")
    assert await asyncio.wait_for(extender.bind(other, "node1"), 5) == {"Error": ""}


async def test_filter_undoes_its_reservation_when_the_patch_fails(emulator: KubeApiEmulator, extender: Served) -> None:
    add_node(emulator, "node1")
    await eventually(lambda: "node1" in extender.state["ledger"])
    ghost = {
        "metadata": {"name": "ghost", "namespace": "default", "uid": "ghost-uid"},
        "spec": {"containers": [gpu_container()]},
    }
    result = await extender.filter(ghost, ["node1"])
    assert "ghost" in result["Error"]
    assert extender.state["ledger"].booking("ghost-uid") is None
    view = extender.state["ledger"].view("node1")
    assert all(d.used == 0 for d in view.usage.devices)


async def test_a_pod_without_a_gpu_in_app_containers_binds_without_holding_the_node(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    pod = add_pod(emulator, "cpu", containers=[{"name": "c", "image": "busybox"}])
    assert await extender.bind(pod, "anywhere") == {"Error": ""}
    assert emulator.store.get(PODS, "default", "cpu")["spec"]["nodeName"] == "anywhere"


async def test_a_node_served_over_the_bus_is_handed_off_without_hamis_lock_annotation(
    emulator: KubeApiEmulator, extender: Served, bus: Bus
) -> None:
    """Our node agent marks its node: its allocator takes placements over NATS and asks the kubelet which
    pod it admits, so nothing there reads HAMi's lock. The bind writes no lock (two Node writes per GPU pod
    fewer, and no Node update every node watcher receives); the hand-off in memory still orders the binds."""
    add_node(emulator, "node1", annotations={NODE_PLACEMENTS: NODE_PLACEMENTS_BUS})
    await eventually(lambda: "node1" in extender.state["ledger"])
    await eventually(lambda: extender.state["publisher"].bus is not None)
    binder = extender.state["binder"]
    await eventually(lambda: binder.cached_node("", "node1") is not None)
    version = emulator.store.get(NODES, None, "node1")["metadata"]["resourceVersion"]
    first = await placed(emulator, extender, "first", "node1")
    second = await placed(emulator, extender, "second", "node1")
    assert await extender.bind(first, "node1") == {"Error": ""}
    waiting = asyncio.create_task(extender.bind(second, "node1"))
    done, _ = await asyncio.wait({waiting}, timeout=0.3)
    assert not done  # the node is handed to "first" until its allocation is seen
    await bus.publish(subjects.allocated("node1"), allocation(first, "node1"))
    assert await asyncio.wait_for(waiting, 5) == {"Error": ""}
    await bus.publish(subjects.allocated("node1"), allocation(second, "node1"))
    await eventually(lambda: binder.handoff.holder("node1") is None)
    # the Node was never written: no lock taken, none to remove
    assert emulator.store.get(NODES, None, "node1")["metadata"]["resourceVersion"] == version
    assert binder.unlocks_handled == 0


async def test_on_a_bus_node_the_binding_carries_the_placement_and_filter_writes_nothing(
    emulator: KubeApiEmulator, extender: Served, bus: Bus
) -> None:
    """Filter's patch was a write per GPU pod that only the Binding needed: on a node our allocator serves,
    the Binding carries the annotations (kube-apiserver copies them onto the pod as it binds it), so the pod
    is written once to be placed and bound. A pod without labels is still patched by Filter, which also
    sets HAMi's node label (a Binding carries no labels, and only a pod with a labels map can be given one
    key by the allocator without a condition on the whole pod); so is every pod on a node HAMi's device
    plugin serves, as HAMi does."""
    add_node(emulator, "node1", annotations={NODE_PLACEMENTS: NODE_PLACEMENTS_BUS})
    add_node(emulator, "node2")
    await eventually(lambda: "node1" in extender.state["ledger"] and "node2" in extender.state["ledger"])
    await eventually(lambda: extender.state["publisher"].bus is not None)
    binder = extender.state["binder"]
    await eventually(lambda: binder.cached_node("", "node1") is not None)

    def version(pod: dict[str, Any]) -> str:
        rv: str = emulator.store.get(PODS, "default", pod["metadata"]["name"])["metadata"]["resourceVersion"]
        return rv

    labelled = add_pod(emulator, "labelled", labels={"app": "train"})
    created = version(labelled)
    assert (await extender.filter(labelled, ["node1"]))["NodeNames"] == ["node1"]
    assert version(labelled) == created  # Filter wrote nothing
    assert VGPU_NODE not in pod_annotations(emulator, "labelled")
    assert await extender.bind(labelled, "node1") == {"Error": ""}
    bound = emulator.store.get(PODS, "default", "labelled")
    annotations = bound["metadata"]["annotations"]
    assert bound["spec"]["nodeName"] == "node1"
    assert annotations[VGPU_NODE] == "node1"
    assert decode_pod_devices(annotations[DEVICES_TO_ALLOCATE]) == decode_pod_devices(annotations[DEVICES_ALLOCATED])
    assert any(decode_pod_devices(annotations[DEVICES_TO_ALLOCATE]))
    assert annotations[BIND_PHASE] == BIND_PHASE_ALLOCATING
    assert extender.state["ledger"].placement(labelled["metadata"]["uid"]) is None
    await bus.publish(subjects.allocated("node1"), allocation(labelled, "node1"))
    await eventually(lambda: binder.handoff.holder("node1") is None)

    for name, node, labels in (("bare", "node1", None), ("hami-node", "node2", {"app": "train"})):
        pod = add_pod(emulator, name, labels=labels)
        assert (await extender.filter(pod, [node]))["NodeNames"] == [node]
        assert pod_annotations(emulator, name)[VGPU_NODE] == node, name  # patched by Filter, as HAMi does
        assert emulator.store.get(PODS, "default", name)["metadata"]["labels"][VGPU_NODE] == node
