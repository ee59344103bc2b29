"""The real twin of tests/e2e/test_mig.py, scaled down: examples/mig.yaml applied with the real kubectl, and
MIG pods mixed with shared ones, through kube-apiserver, our webhook, kube-scheduler and our extender to a
MIG node beside a shared node. No two instances overlap, each pod holds the profile its memory asks for, and
the (fake) driver holds exactly the instances the annotations name."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_common.annotations import MIG_ALLOCATIONS, VGPU_MODE, MigAllocation, decode_mig_allocations
from hami_common.annotations.registration import MODE_HAMI_CORE, MODE_MIG
from hami_common.envvars import NVIDIA_VISIBLE_DEVICES
from hami_common.inventory import open_mig_control
from hami_common.kube import Pod
from hami_common.scheduling.mig import overlaps
from hami_sim.realk8s import K8sBinaries
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import audit as audit_cluster
from hami_sim.stack.audit import gpu_pod
from hami_sim.waiting import eventually
from tests.realk8s.conftest import kubectl, real_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mig.yaml"
SMALL, LARGE, SHARED = 5, 1, 12  # + the example's two: 6 x 1g.10gb + 2 x 1g.20gb = 10 of the 14 slices


def workload() -> Iterator[dict[str, object]]:
    """MIG pods (1g.10gb or 1g.20gb) and shared pods, interleaved, each saying which kind of card it wants."""
    rng = random.Random(23)
    kinds = ["mig-small"] * SMALL + ["mig-large"] * LARGE + ["shared"] * SHARED
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


@pytest.mark.timeout(360)
async def test_mig_example_and_a_mixed_workload_on_the_real_control_plane_never_overlap(
    k8s: K8sBinaries, tmp_path: Path, sockdir: Path
) -> None:
    config = dataclasses.replace(real_config(tmp_path, sockdir, nodes=1), gpus_per_node=4, mig_nodes=1)
    async with LocalCluster(config) as cluster:
        out = await asyncio.to_thread(kubectl, k8s, cluster, "apply", "-f", str(EXAMPLE))
        assert "pod/mig-small created" in out
        assert "pod/mig-large created" in out
        created = await asyncio.gather(*(cluster.submit(pod) for pod in workload()))
        uids = {pod["metadata"]["uid"] for pod in created}
        for name in ("mig-small", "mig-large"):
            uids.add((await cluster.kube.get_pod("default", name)).metadata.uid)
        async with asyncio.timeout(180):
            admitted = await cluster.wait_admitted(uids)
        assert all(a.admission.ok for a in admitted.values()), [a.admission for a in admitted.values()]

        mig_nodes = set(config.mig_node_names())
        listed, _ = await cluster.kube.list_pods()
        pods = [p for p in listed if p.metadata.uid in uids]
        mig_pods = [p for p in pods if p.metadata.annotations.get(VGPU_MODE) == MODE_MIG]
        shared = [p for p in pods if p.metadata.annotations.get(VGPU_MODE) == MODE_HAMI_CORE]
        assert (len(mig_pods), len(shared)) == (SMALL + LARGE + 2, SHARED)
        assert {p.spec.node_name for p in mig_pods} == mig_nodes
        assert not {p.spec.node_name for p in shared} & mig_nodes
        report = audit_cluster(shared, admitted, cluster.capacity())
        assert report.problems == []
        assert report.allocated == SHARED

        by_card: dict[str, list[MigAllocation]] = {}
        for pod in mig_pods:
            (instance,) = reservations(pod)
            assert instance.profile == ("1g.10gb" if pod.metadata.name.startswith("mig-small") else "1g.20gb")
            by_card.setdefault(instance.gpu_uuid, []).append(instance)
        for card, instances in by_card.items():
            for i, a in enumerate(instances):
                for b in instances[i + 1 :]:
                    assert not overlaps(a.placement, b.placement), (card, a, b)

        async def realised() -> bool:
            found, _ = await cluster.kube.list_pods()
            return all(r.realised for p in found if p.metadata.uid in uids for r in reservations(p))

        await eventually(realised, timeout=60, what="every MIG reservation carries its runtime ids")
        found, _ = await cluster.kube.list_pods()
        final = {p.metadata.uid: p for p in found if p.metadata.uid in uids}
        for pod in mig_pods:
            (instance,) = reservations(final[pod.metadata.uid])
            answer = admitted[pod.metadata.uid].admission.container("main")
            assert answer.envs.get(NVIDIA_VISIBLE_DEVICES) == instance.mig_uuid
            assert not any(key.startswith("CUDA_DEVICE_") for key in answer.envs)  # no HAMi-core limits

        driver: dict[str, tuple[str, int, int, str]] = {}
        for node in mig_nodes:
            control = await asyncio.to_thread(open_mig_control, "fake", node=node, fake_file=config.inventory_file)
            for made in await asyncio.to_thread(control.instances):
                driver[made.mig_uuid] = (made.gpu_uuid, made.placement.start, made.placement.size, made.profile)
        annotated = {
            r.mig_uuid: (r.gpu_uuid, r.placement.start, r.placement.size, r.profile)
            for p in final.values()
            for r in reservations(p)
        }
        assert driver == annotated
        assert cluster.failures() == {}
