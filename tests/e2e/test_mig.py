"""MIG end to end: 200 pods at once on a cluster of MIG nodes beside shared ones, through every layer."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from hami_common.annotations import BIND_PHASE, MIG_ALLOCATIONS, VGPU_MODE, MigAllocation, decode_mig_allocations
from hami_common.annotations.registration import MODE_HAMI_CORE, MODE_MIG
from hami_common.envvars import NVIDIA_VISIBLE_DEVICES
from hami_common.inventory import open_mig_control
from hami_common.kube import Pod
from hami_common.scheduling.mig import overlaps
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import audit as audit_cluster
from hami_sim.stack.audit import gpu_pod
from hami_sim.waiting import eventually

from .conftest import stack_config

MIG_PODS = 70  # 60 x 1g.10gb (one memory slice each) + 10 x 1g.20gb (two each) = 80 slices
SHARED_PODS = 130  # on 4 shared nodes x 4 GPUs x 10 slices
MIG_NODES = 8  # x 2 A100-80GB: 16 cards of 7 1g placements, room to spare for the 80 slices the MIG pods take


@pytest.fixture
async def cluster(tmp_path: Path, sockdir: Path) -> AsyncIterator[LocalCluster]:
    config = dataclasses.replace(stack_config(tmp_path, sockdir, nodes=4, gpus=4), mig_nodes=MIG_NODES)
    async with LocalCluster(config) as running:
        yield running


def workload() -> Iterator[dict[str, object]]:
    """MIG pods (1g.10gb or 1g.20gb) and shared pods, interleaved, each saying which kind of card it wants."""
    rng = random.Random(19)
    kinds = ["mig-small"] * 60 + ["mig-large"] * 10 + ["shared"] * SHARED_PODS
    rng.shuffle(kinds)
    for i, kind in enumerate(kinds):
        if kind == "shared":
            mode, mem = MODE_HAMI_CORE, rng.choice((1000, 2000, 4000))
        else:
            mode, mem = MODE_MIG, 8000 if kind == "mig-small" else 16000
        yield gpu_pod(f"{kind}-{i:03d}", mem=mem, annotations={VGPU_MODE: mode})


def reservations(pod: Pod) -> tuple[MigAllocation, ...]:
    value = pod.metadata.annotations.get(MIG_ALLOCATIONS)
    return decode_mig_allocations(value) if value else ()


@pytest.mark.timeout(300)
async def test_two_hundred_pods_on_mig_and_shared_nodes_never_overlap_and_every_layer_agrees(
    cluster: LocalCluster,
) -> None:
    created = await asyncio.gather(*(cluster.submit(pod) for pod in workload()))
    uids = {pod["metadata"]["uid"] for pod in created}
    try:
        async with asyncio.timeout(240):
            admitted = await cluster.wait_admitted(uids)
    except TimeoutError:
        listed, _ = await cluster.kube.list_pods()
        waiting = [
            (p.metadata.name, p.spec.node_name, p.metadata.annotations.get(BIND_PHASE), cluster.verdict(p.metadata.uid))
            for p in listed
            if p.metadata.uid in uids and p.metadata.uid not in cluster.admitted
        ]
        pytest.fail(f"{len(waiting)} pods not admitted, e.g. {waiting[:5]}")
    assert all(a.admission.ok for a in admitted.values()), [
        a.admission for a in admitted.values() if not a.admission.ok
    ]

    mig_nodes = set(cluster.config.mig_node_names())
    pods_list, _ = await cluster.kube.list_pods()
    pods = [p for p in pods_list if p.metadata.uid in uids]
    mig_pods = [p for p in pods if p.metadata.annotations.get(VGPU_MODE) == MODE_MIG]
    shared = [p for p in pods if p.metadata.annotations.get(VGPU_MODE) == MODE_HAMI_CORE]
    assert (len(mig_pods), len(shared)) == (MIG_PODS, SHARED_PODS)

    # each pod landed where its request can be met: MIG pods on MIG nodes, shared pods never there
    assert {p.spec.node_name for p in mig_pods} <= mig_nodes
    assert not {p.spec.node_name for p in shared} & mig_nodes
    report = audit_cluster(shared, admitted, cluster.capacity())  # HAMi-core answers match the annotations
    assert report.problems == []
    assert report.allocated == SHARED_PODS

    # every MIG pod holds one instance of the profile its memory asks for, and no two placements overlap
    by_card: dict[str, list[MigAllocation]] = {}
    for pod in mig_pods:
        (instance,) = reservations(pod)
        assert instance.profile == ("1g.10gb" if pod.metadata.name.startswith("mig-small") else "1g.20gb")
        by_card.setdefault(instance.gpu_uuid, []).append(instance)
    for card, instances in by_card.items():
        for i, a in enumerate(instances):
            for b in instances[i + 1 :]:
                assert not overlaps(a.placement, b.placement), (card, a, b)

    # the allocator created each instance, wrote its ids back and answered with that MIG device only
    async def realised() -> bool:
        listed, _ = await cluster.kube.list_pods()
        return all(r.realised for p in listed if p.metadata.uid in uids for r in reservations(p))

    await eventually(realised, timeout=60, what="every MIG reservation carries its runtime ids")
    listed, _ = await cluster.kube.list_pods()
    final = {p.metadata.uid: p for p in listed if p.metadata.uid in uids}
    for pod in mig_pods:
        (instance,) = reservations(final[pod.metadata.uid])
        answer = admitted[pod.metadata.uid].admission.container("main")
        assert answer.envs.get(NVIDIA_VISIBLE_DEVICES) == instance.mig_uuid
        assert not any(key.startswith("CUDA_DEVICE_") for key in answer.envs)  # no HAMi-core limits

    # the driver holds exactly the instances the annotations name, and nothing else
    driver: dict[str, tuple[str, int, int, str]] = {}
    for node in mig_nodes:
        control = await asyncio.to_thread(open_mig_control, "fake", node=node, fake_file=cluster.config.inventory_file)
        for made in await asyncio.to_thread(control.instances):
            driver[made.mig_uuid] = (made.gpu_uuid, made.placement.start, made.placement.size, made.profile)
    annotated = {
        r.mig_uuid: (r.gpu_uuid, r.placement.start, r.placement.size, r.profile)
        for p in final.values()
        for r in reservations(p)
    }
    assert driver == annotated
    assert cluster.failures() == {}
