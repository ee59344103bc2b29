"""Filter and Bind through real HTTP against the Kubernetes API emulator (hami-protocol §4.4, §4.10)."""

from __future__ import annotations

import asyncio
from datetime import datetime

from hami_common.annotations import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_HANDSHAKE,
    NODE_LOCK,
    VGPU_NODE,
    VGPU_TIME,
    encode_handshake,
)
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.waiting import eventually
from tests.extender.cluster import NODES, PODS, add_node, add_pod, cards, pod_annotations
from tests.extender.conftest import Served


async def synced(extender: Served, *nodes: str) -> None:
    await eventually(lambda: all(n in extender.state["ledger"] for n in nodes))


async def test_filter_returns_one_node_and_writes_hamis_annotations(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    add_node(emulator, "node1")
    add_node(emulator, "node2")
    await synced(extender, "node1", "node2")
    pod = add_pod(emulator, "p1")
    response = await extender.client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": ["node1", "node2"]})
    assert response.headers["server-timing"].startswith("filter;dur=")
    result = response.json()
    assert result["Error"] == ""
    assert len(result["NodeNames"]) == 1
    node = result["NodeNames"][0]
    anns = pod_annotations(emulator, "p1")
    assert anns[VGPU_NODE] == node
    assert anns[DEVICES_TO_ALLOCATE] == anns[DEVICES_ALLOCATED]
    assert anns[DEVICES_ALLOCATED].endswith(",NVIDIA,1000,0:;")
    assert anns[VGPU_TIME].isdigit()
    labels = emulator.store.get(PODS, "default", "p1")["metadata"]["labels"]
    assert labels[VGPU_NODE] == node
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


async def test_filter_reports_unregistered_and_full_nodes_with_hamis_reasons(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    add_node(emulator, "small", cards("small", n=1, devmem=500))
    await synced(extender, "small")
    result = await extender.filter(add_pod(emulator, "p1"), ["small", "ghost"])
    assert result["NodeNames"] is None
    assert result["FailedNodes"] == {"small": "1/1 CardInsufficientMemory", "ghost": "node unregistered"}


async def test_pod_without_gpu_passes_every_node_untouched(emulator: KubeApiEmulator, extender: Served) -> None:
    pod = add_pod(emulator, "cpu", containers=[{"name": "c", "image": "busybox"}])
    result = await extender.filter(pod, ["a", "b"])
    assert result["NodeNames"] == ["a", "b"]
    assert VGPU_NODE not in pod_annotations(emulator, "cpu")


async def test_two_pods_racing_for_the_last_gpu_get_it_exactly_once(
    emulator: KubeApiEmulator, extender: Served
) -> None:

    add_node(emulator, "one", cards("one", n=1, devmem=1000))
    await synced(extender, "one")
    a, b = add_pod(emulator, "a"), add_pod(emulator, "b")
    results = await asyncio.gather(extender.filter(a, ["one"]), extender.filter(b, ["one"]))
    winners = [r for r in results if r["NodeNames"]]
    losers = [r for r in results if not r["NodeNames"]]
    assert len(winners) == 1
    assert len(losers) == 1
    assert losers[0]["FailedNodes"] == {"one": "1/1 CardInsufficientMemory"}


async def test_bind_sets_bind_phase_binds_the_pod_and_holds_the_node(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    add_node(emulator, "node1")
    await synced(extender, "node1")
    pod = add_pod(emulator, "p1")
    assert (await extender.filter(pod, ["node1"]))["NodeNames"] == ["node1"]
    assert await extender.bind(pod, "node1") == {"Error": ""}
    stored = emulator.store.get(PODS, "default", "p1")
    assert stored["spec"]["nodeName"] == "node1"
    anns = stored["metadata"]["annotations"]
    assert anns[BIND_PHASE] == "allocating"
    assert anns[BIND_TIME].isdigit()
    lock = emulator.store.get(NODES, None, "node1")["metadata"]["annotations"][NODE_LOCK]
    assert lock.endswith(",default,p1")


async def test_a_bind_takes_the_lock_from_the_cached_node_and_marks_the_pod_through_the_binding(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    add_node(emulator, "node1", annotations={NODE_HANDSHAKE: encode_handshake(datetime.now().astimezone())})
    await synced(extender, "node1")
    pod = add_pod(emulator, "p1")
    assert (await extender.filter(pod, ["node1"]))["NodeNames"] == ["node1"]
    node_path, pod_path = "/api/v1/nodes/node1", "/api/v1/namespaces/default/pods/p1"
    before = emulator.count("GET", node_path), emulator.count("PATCH", pod_path), emulator.count("PATCH", node_path)
    assert await extender.bind(pod, "node1") == {"Error": ""}
    after = emulator.count("GET", node_path), emulator.count("PATCH", pod_path), emulator.count("PATCH", node_path)
    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (0, 0, 1)
    anns = pod_annotations(emulator, "p1")
    assert anns[BIND_PHASE] == "allocating"
    assert emulator.store.get(PODS, "default", "p1")["spec"]["nodeName"] == "node1"


async def test_a_pod_naming_a_gpu_quantity_past_int32_is_an_error_at_filter_and_bind_never_a_gpu_less_pod(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    """``gpumem: 3Gi`` is 3221225472 MiB, past HAMi's int32: HAMi reads the pod as asking for no GPU, so
    Filter passed every node and Bind bound it with no placement, and at Allocate it was served another
    pod's grant. Such a pod can reach the extender without our webhook (a namespace opted out of it, or
    HAMi's webhook beside ours); it gets an error naming the resource, and nothing is bound or annotated."""
    add_node(emulator, "node1")
    await synced(extender, "node1")
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3Gi"}
    pod = add_pod(emulator, "thief", containers=[{"name": "c", "image": "cuda", "resources": {"limits": limits}}])
    result = await extender.filter(pod, ["node1"])
    assert result["NodeNames"] is None
    assert result["Error"] == (
        "invalid nvidia.com/gpumem value '3Gi' in container c: it is too large; "
        "it must be a whole number from 0 to 2147483647"
    )
    bound = await extender.bind(pod, "node1")
    assert "nvidia.com/gpumem" in bound["Error"]
    stored = emulator.store.get(PODS, "default", "thief")
    assert not stored["spec"].get("nodeName")
    assert VGPU_NODE not in (stored["metadata"].get("annotations") or {})
