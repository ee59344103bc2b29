"""The whole path on the real control plane: kubectl → kube-apiserver → our webhook → kube-scheduler → our
extender → NATS → node agent → allocator → kubelet → Running; and kube-scheduler's own account of a pod
that fits nowhere."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from hami_common.kube import Pod
from hami_sim.realk8s import K8sBinaries
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import audit as audit_cluster
from hami_sim.stack.audit import gpu_pod, mixed_workload
from hami_sim.waiting import eventually

GPU_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  containers:
    - name: cuda
      image: nvidia/cuda:12.4.0-base-ubuntu22.04
      resources:
        limits:
          nvidia.com/gpu: 1
          nvidia.com/gpumem: {mem}
          nvidia.com/gpucores: 30
"""


def kubectl(k8s: K8sBinaries, cluster: LocalCluster, *args: str) -> str:
    done = subprocess.run(
        [k8s["kubectl"], "--kubeconfig", str(cluster.config.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def pods_of(cluster: LocalCluster, uids: set[str]) -> list[Pod]:
    pods, _ = await cluster.kube.list_pods()
    return [p for p in pods if p.metadata.uid in uids]


@pytest.mark.timeout(300)
async def test_kubectl_apply_of_a_gpu_pod_reaches_the_webhook_the_extender_the_allocator_and_runs(
    real_cluster: LocalCluster, k8s: K8sBinaries, tmp_path: Path
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(GPU_POD.format(name="gpu-apply", mem=3000))
    out = await asyncio.to_thread(kubectl, k8s, real_cluster, "apply", "-f", str(manifest))
    assert "pod/gpu-apply created" in out

    pod = await real_cluster.kube.get_pod("default", "gpu-apply")
    assert pod.spec.scheduler_name == "hami-scheduler"  # the apiserver called our webhook
    async with asyncio.timeout(120):
        admitted = (await real_cluster.wait_admitted({pod.metadata.uid}))[pod.metadata.uid]
    assert admitted.admission.ok, admitted.admission
    envs = admitted.admission.container("cuda").envs
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"

    async def running() -> bool:
        return (await real_cluster.kube.get_pod("default", "gpu-apply")).status.phase == "Running"

    await eventually(running, timeout=60, what="the pod reported Running")
    placed = await real_cluster.kube.get_pod("default", "gpu-apply")
    assert placed.spec.node_name == admitted.node
    assert envs["NVIDIA_VISIBLE_DEVICES"] in (placed.metadata.annotations or {})["hami.io/vgpu-devices-allocated"]
    # kube-scheduler itself recorded the placement, and kubectl reads it back as a table
    scheduled = await real_cluster.kube.list_events("default", field_selector="reason=Scheduled")
    assert any(e.involved_object.name == "gpu-apply" and admitted.node in e.message for e in scheduled)
    table = await asyncio.to_thread(kubectl, k8s, real_cluster, "get", "pod", "gpu-apply", "-o", "wide")
    assert "Running" in table
    assert " 1/1 " in table  # READY: the kubelet reported the container started and ready
    assert admitted.node in table


@pytest.mark.timeout(300)
async def test_a_pod_that_fits_nowhere_shows_kube_schedulers_failed_scheduling_event_with_our_reasons(
    real_cluster: LocalCluster,
) -> None:
    created = await real_cluster.submit(gpu_pod("too-big", mem=200_000))  # no card has 200 GB
    uid = created["metadata"]["uid"]

    async def failed_scheduling() -> str:
        events = await real_cluster.kube.list_events("default", field_selector="reason=FailedScheduling")
        return next((e.message for e in events if e.involved_object.uid == uid), "")

    message = await eventually(failed_scheduling, timeout=90, what="FailedScheduling from kube-scheduler")
    assert "CardInsufficientMemory" in message, message
    assert f"0/{real_cluster.config.nodes} nodes are available" in message, message
    pod = await real_cluster.kube.get_pod("default", "too-big")
    assert pod.status.phase == "Pending"
    assert not pod.spec.node_name


@pytest.mark.timeout(420)
async def test_two_hundred_pods_through_the_real_scheduler_get_exactly_their_devices(
    k8s: K8sBinaries, tmp_path: Path, sockdir: Path
) -> None:
    from tests.realk8s.conftest import real_config

    async with LocalCluster(real_config(tmp_path, sockdir, nodes=10)) as cluster:
        created = await asyncio.gather(*(cluster.submit(pod) for pod in mixed_workload(200)))
        uids = {pod["metadata"]["uid"] for pod in created}
        async with asyncio.timeout(300):
            admitted = await cluster.wait_admitted(uids)
        assert all(a.admission.ok for a in admitted.values())
        report = audit_cluster(await pods_of(cluster, uids), admitted, cluster.capacity())
        assert report.problems == []
        assert report.allocated == 200
        assert cluster.failures() == {}
