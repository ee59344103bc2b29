"""The real twin of the namespace quota (tests/webhook/test_quota.py): a ResourceQuota on nvidia.com/gpumem
and nvidia.com/gpucores in a namespace, pods applied with the real kubectl. kube-apiserver calls our webhook,
which counts the GPU slices the namespace's placed pods hold: a pod within the quota is placed, one over it
is refused with HAMi's message on kubectl's terminal, and a deleted pod gives its share back."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from hami_common.resources import GPU_CORES, GPU_MEMORY
from hami_sim.realk8s import K8sBinaries
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import audit as audit_cluster
from hami_sim.stack.audit import gpu_pod, usage_by_gpu
from hami_sim.waiting import eventually
from hami_webhook.admission import QUOTA_EXCEEDED
from tests.realk8s.conftest import kubectl, real_config

TEAM = "team-a"
MEMORY_QUOTA = 4000  # MiB over every GPU of the namespace's pods
CORES_QUOTA = 100


def quota() -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": TEAM},
        "spec": {"hard": {f"limits.{GPU_MEMORY}": str(MEMORY_QUOTA), f"limits.{GPU_CORES}": str(CORES_QUOTA)}},
    }


@pytest.mark.timeout(300)
async def test_pods_over_the_namespace_gpu_quota_are_refused_through_kubectl_and_pods_within_it_placed(
    k8s: K8sBinaries, tmp_path: Path, sockdir: Path
) -> None:
    async with LocalCluster(real_config(tmp_path, sockdir, nodes=2)) as cluster:

        async def apply(name: str, manifest: dict[str, object]) -> str:
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(manifest))
            return await asyncio.to_thread(kubectl, k8s, cluster, "apply", "-f", str(path), check=False)

        async def placed(namespace: str, name: str) -> str:
            uid = (await cluster.kube.get_pod(namespace, name)).metadata.uid
            async with asyncio.timeout(120):
                admitted = await cluster.wait_admitted({uid})
            assert admitted[uid].admission.ok, admitted[uid].admission
            return uid

        for namespace in (TEAM, "elsewhere"):
            await asyncio.to_thread(kubectl, k8s, cluster, "create", "namespace", namespace)
        assert "resourcequota/gpu created" in await apply("quota", quota())

        # 3000 MiB and 60% of the cores: within the quota, placed
        assert "created" in await apply("first", gpu_pod("first", mem=3000, cores=60, namespace=TEAM))
        await placed(TEAM, "first")

        # 1000 MiB more would fit, but 2 x 1000 MiB (two GPUs) or 2000 MiB do not, nor 50% more cores
        for name, pod in (
            ("two-gpus", gpu_pod("two-gpus", gpus=2, mem=1000, namespace=TEAM)),
            ("more-memory", gpu_pod("more-memory", mem=2000, namespace=TEAM)),
            ("more-cores", gpu_pod("more-cores", mem=500, cores=50, namespace=TEAM)),
        ):
            refused = await apply(name, pod)
            assert "denied the request" in refused, refused
            assert QUOTA_EXCEEDED in refused, refused
        pods, _ = await cluster.kube.list_pods(TEAM)
        assert [p.metadata.name for p in pods] == ["first"]  # nothing refused was stored

        assert "created" in await apply("last", gpu_pod("last", mem=1000, cores=40, namespace=TEAM))
        await placed(TEAM, "last")  # exactly the quota: 4000 MiB, 100% of the cores
        # another namespace has no quota: the same request goes through there
        assert "created" in await apply("other", gpu_pod("more-memory", mem=2000, namespace="elsewhere"))
        await placed("elsewhere", "more-memory")

        # a deleted pod gives its share back: the refused request now fits
        await asyncio.to_thread(kubectl, k8s, cluster, "delete", "pod", "first", "-n", TEAM, "--wait=true")

        async def accepted() -> bool:
            return "created" in await apply("more-memory", gpu_pod("more-memory", mem=2000, namespace=TEAM))

        await eventually(accepted, timeout=60, what="the webhook counts the deleted pod out of the quota")
        await placed(TEAM, "more-memory")

        listed, _ = await cluster.kube.list_pods()
        report = audit_cluster(listed, cluster.admitted, cluster.capacity())
        assert report.problems == []
        team = [p for p in listed if p.metadata.namespace == TEAM]
        assert sorted(p.metadata.name for p in team) == ["last", "more-memory"]
        held = usage_by_gpu(team).values()  # what the extender granted the namespace, per card
        assert sum(mem for mem, _, _ in held) == 3000
        assert sum(cores for _, cores, _ in held) == 40
        assert cluster.failures() == {}
