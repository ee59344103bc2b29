"""Preemption of GPU slices with the real kube-scheduler: its dry run finds that the node is out of slices, it
asks our extender's preempt verb which pods to evict, deletes exactly those, nominates the node, and the
preemptor lands there with its devices; no card is over-committed on the way.

One node with one 8000 MiB card split 4 ways, full of four low-priority pods (slices 4/4, 6000 of 8000 MiB).
kube-scheduler counts ``nvidia.com/gpu`` (the deployed configuration no longer ignores it), so a pod asking
for a fifth slice needs a victim in its own eyes; the extender then picks the victim that frees enough memory
on the card, which kube-scheduler cannot see.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_common.annotations import DEVICES_ALLOCATED, decode_pod_devices
from hami_common.kube import Pod
from hami_sim.realk8s import K8sBinaries
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import gpu_pod
from hami_sim.waiting import eventually
from tests.realk8s.conftest import real_config

CARD_MIB = 8000
LOW, HIGH = "gpu-low", "gpu-high"
Json = dict[str, Any]


LOWEST = "gpu-lowest"
PRIORITY_CLASSES = {LOWEST: 5, LOW: 10, HIGH: 1000}


@contextlib.asynccontextmanager
async def _card_cluster(tmp_path: Path, sockdir: Path, split_count: int) -> AsyncIterator[LocalCluster]:
    """One node with one CARD_MIB card split ``split_count`` ways, and the PriorityClasses of these tests."""
    config = dataclasses.replace(
        real_config(tmp_path, sockdir, nodes=1), gpus_per_node=1, gpu_memory_mib=CARD_MIB, split_count=split_count
    )
    async with LocalCluster(config) as cluster:
        for name, value in PRIORITY_CLASSES.items():
            body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
            cluster.api.create("scheduling.k8s.io", "v1", "priorityclasses", None, {**body, "value": value})
        yield cluster


@pytest.fixture
async def one_card(k8s: K8sBinaries, tmp_path: Path, sockdir: Path) -> AsyncIterator[LocalCluster]:
    del k8s
    async with _card_cluster(tmp_path, sockdir, split_count=4) as cluster:
        yield cluster


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "preemption"


def _example_documents() -> list[Json]:
    return [d for f in sorted(EXAMPLE.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def _with_priority(pod: Json, priority_class: str) -> Json:
    pod["spec"]["priorityClassName"] = priority_class
    return pod


def _held_mib(pods: list[Pod]) -> dict[str, int]:
    """MiB granted per card by the pods that still exist (terminating ones included: they may still run)."""
    held: dict[str, int] = {}
    for pod in pods:
        value = pod.metadata.annotations.get(DEVICES_ALLOCATED)
        if not value or pod.status.phase in ("Succeeded", "Failed"):
            continue
        for container in decode_pod_devices(value):
            for device in container:
                held[device.uuid] = held.get(device.uuid, 0) + device.usedmem
    return held


@pytest.mark.timeout(300)
async def test_a_high_priority_pod_evicts_exactly_the_minimal_victim_and_runs_in_its_place(
    one_card: LocalCluster,
) -> None:
    cluster = one_card
    # kube-scheduler alone would evict the youngest low pod (it sees slices only), which frees 500 MiB: too
    # little for 5000. Only the oldest, 4500 MiB, makes room on the card: the extender must choose it.
    sizes = {"low-a": 4500, "low-b": 500, "low-c": 500, "low-d": 500}
    low = {}
    for name, mem in sizes.items():
        created = await cluster.submit(_with_priority(gpu_pod(name, mem=mem), LOW))
        low[created["metadata"]["uid"]] = name
    async with asyncio.timeout(120):
        await cluster.wait_admitted(low)

    peak: dict[str, int] = {}
    sampling = True

    async def sample() -> None:
        while sampling:
            pods, _ = await cluster.kube.list_pods("default")
            for card, mib in _held_mib(pods).items():
                peak[card] = max(peak.get(card, 0), mib)
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    try:
        # an equal-priority pod never preempts: it waits
        peer = await cluster.submit(_with_priority(gpu_pod("peer", mem=1000), LOW))
        urgent = await cluster.submit(_with_priority(gpu_pod("urgent", mem=5000), HIGH))
        async with asyncio.timeout(150):
            admitted = (await cluster.wait_admitted({urgent["metadata"]["uid"]}))[urgent["metadata"]["uid"]]
    finally:
        sampling = False
        await sampler

    assert admitted.admission.ok, admitted.admission
    assert admitted.admission.container("main").envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5000m"
    pods, _ = await cluster.kube.list_pods("default")
    left = {p.metadata.name for p in pods}
    evicted = set(sizes) - left
    assert evicted == {"low-a"}, f"exactly the one victim that frees enough memory, not {sorted(evicted)}"
    assert "peer" in left
    peer_now = next(p for p in pods if p.metadata.name == "peer")
    assert not peer_now.spec.node_name, "the equal-priority pod must still be waiting"
    assert peer_now.metadata.uid == peer["metadata"]["uid"]
    assert all(mib <= CARD_MIB for mib in peak.values()), f"over-committed during the hand-over: {peak}"

    async def nominated_cleared() -> bool:
        now = await cluster.kube.get_pod("default", "urgent")
        return bool(now.spec.node_name)

    await eventually(nominated_cleared, timeout=30, what="the preemptor bound")


@pytest.mark.timeout(300)
async def test_the_example_preempts_three_batch_pods_for_the_urgent_one(
    k8s: K8sBinaries, tmp_path: Path, sockdir: Path
) -> None:
    """examples/preemption as its README runs it: one default card (81920 MiB, split 10), ten batch pods of
    8000 MiB, an urgent pod of 20000 MiB: kube-scheduler needs one victim for the slice, the extender three."""
    del k8s
    documents = _example_documents()
    config = dataclasses.replace(real_config(tmp_path, sockdir, nodes=1), gpus_per_node=1)
    async with LocalCluster(config) as cluster:
        for doc in documents:
            if doc["kind"] == "PriorityClass":
                cluster.api.create("scheduling.k8s.io", "v1", "priorityclasses", None, doc)
        batch = [await cluster.submit(d) for d in documents if d["kind"] == "Pod" and d["metadata"]["name"] != "urgent"]
        async with asyncio.timeout(120):
            await cluster.wait_admitted({p["metadata"]["uid"] for p in batch})
        (urgent,) = [d for d in documents if d["kind"] == "Pod" and d["metadata"]["name"] == "urgent"]
        created = await cluster.submit(urgent)
        async with asyncio.timeout(150):
            admitted = (await cluster.wait_admitted({created["metadata"]["uid"]}))[created["metadata"]["uid"]]
        assert admitted.admission.container("cuda").envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "20000m"
        pods, _ = await cluster.kube.list_pods("default")
        assert len([p for p in pods if p.metadata.name.startswith("batch-")]) == 10 - 3
        preempted = await cluster.kube.list_events("default", field_selector="reason=Preempted")
        assert len({e.involved_object.name for e in preempted}) == 3


@pytest.mark.timeout(300)
async def test_a_pod_a_disruption_budget_protects_is_spared_when_another_victim_works(
    k8s: K8sBinaries, tmp_path: Path, sockdir: Path
) -> None:
    """Two victims of 3500 MiB on a full card. The guarded one is the less important (it would be chosen
    without its budget); a PodDisruptionBudget allowing no disruption (no controller updates it here) guards
    it, so the other goes."""
    del k8s
    async with _card_cluster(tmp_path, sockdir, split_count=3) as cluster:
        budget = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "keep-guarded"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}},
        }
        cluster.api.create("policy", "v1", "poddisruptionbudgets", "default", budget)
        low = {}
        for name, mem, priority in (("guarded", 3500, LOWEST), ("other", 3500, LOW), ("small", 500, LOW)):
            pod = _with_priority(gpu_pod(name, mem=mem), priority)
            if name == "guarded":
                pod["metadata"]["labels"] = {"app": "guarded"}
            created = await cluster.submit(pod)
            low[created["metadata"]["uid"]] = name
        async with asyncio.timeout(120):
            await cluster.wait_admitted(low)
        urgent = await cluster.submit(_with_priority(gpu_pod("urgent", mem=3500), HIGH))
        async with asyncio.timeout(150):
            admitted = (await cluster.wait_admitted({urgent["metadata"]["uid"]}))[urgent["metadata"]["uid"]]
        assert admitted.admission.ok, admitted.admission
        pods, _ = await cluster.kube.list_pods("default")
        assert {p.metadata.name for p in pods} == {"guarded", "small", "urgent"}
