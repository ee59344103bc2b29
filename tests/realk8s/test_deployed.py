"""The dev overlay as shipped, run as the system: every object applied to the real kube-apiserver as rendered,
every pod of every Deployment, StatefulSet and DaemonSet run as processes with exactly its command, args,
env, Secrets, ConfigMaps and projected tokens (hami_sim.deployed). A GPU pod applied with kubectl then goes
through the deployed webhook, the deployed kube-scheduler and extender, NATS with TLS and the auth callout,
and the deployed node pod, to the kubelet's Allocate."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from hami_common.kube import KubeClient, KubeSettings
from hami_common.resources import GPU
from hami_sim.deployed import MAPPING, Launcher
from hami_sim.kubelet import KubeletEmulator
from hami_sim.realk8s import ControlPlane, K8sBinaries
from hami_sim.stack import StackConfig
from hami_sim.stack._config import write_grant_key, write_inventory
from hami_sim.waiting import eventually

Json = dict[str, Any]
NODES = ("gpu-node-0", "gpu-node-1")
GPU_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: deployed-gpu
  namespace: default
spec:
  containers:
    - name: cuda
      image: nvidia/cuda:12.4.0-base-ubuntu22.04
      resources:
        limits:
          nvidia.com/gpu: 1
          nvidia.com/gpumem: 3000
          nvidia.com/gpucores: 30
"""


@pytest.fixture
def hosts() -> Iterator[Path]:
    """The nodes' root folders: short, as the kubelet's unix sockets live there."""
    root = Path(tempfile.mkdtemp(prefix="hosts-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _node(name: str, gpus: int, split: int) -> Json:
    machine = {"cpu": "64", "memory": "512Gi", "pods": "250", GPU: str(gpus * split)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "gpu": "on"}},
        "status": {"capacity": machine, "allocatable": machine, "conditions": [{"type": "Ready", "status": "True"}]},
    }


class Deployed:
    def __init__(self, plane: ControlPlane, launcher: Launcher, kubeconfig: Path) -> None:
        self.plane = plane
        self.launcher = launcher
        self.kubeconfig = kubeconfig


@pytest.fixture
async def deployed(k8s: K8sBinaries, tmp_path: Path, hosts: Path) -> AsyncIterator[Deployed]:
    config = StackConfig(workdir=tmp_path / "stack", sockdir=hosts, nodes=len(NODES), gpus_per_node=4)
    write_inventory(config)
    write_grant_key(config)
    plane = ControlPlane(workdir=tmp_path / "k8s", binaries=k8s)
    launcher: Launcher | None = None
    try:
        await asyncio.to_thread(plane.start)
        kubeconfig = plane.write_kubeconfig(tmp_path / "admin.kubeconfig")
        for name in NODES:
            plane.create("", "v1", "nodes", None, _node(name, 4, 10))
        launcher = Launcher(
            plane,
            tmp_path / "deployed",
            nodes={n: {"gpu": "on"} for n in NODES},
            hosts=hosts,
            inventory=config.inventory_file,
        )
        await asyncio.to_thread(launcher.render)
        await asyncio.to_thread(launcher.apply_objects)
        nats = launcher.pod_names("hami-nats")
        await asyncio.to_thread(launcher.start_pods, nats)
        await asyncio.to_thread(launcher.wait_ready, nats)
        control = [*launcher.pod_names("hami-webhook"), *launcher.pod_names("hami-metrics")]
        control += launcher.pod_names("hami-scheduler")
        nodes = launcher.pod_names("hami-node")
        await asyncio.to_thread(launcher.start_pods, [*control, *nodes])
        await asyncio.to_thread(launcher.wait_ready, [*control, *nodes])
        await asyncio.to_thread(launcher.apply_objects, webhooks=True)
        yield Deployed(plane, launcher, kubeconfig)
    finally:
        if launcher is not None:
            await asyncio.to_thread(launcher.stop)
        await asyncio.to_thread(plane.close)


@pytest.mark.timeout(420)
async def test_the_dev_overlay_as_rendered_places_and_allocates_a_gpu_pod_applied_with_kubectl(
    deployed: Deployed, k8s: K8sBinaries, tmp_path: Path, hosts: Path
) -> None:
    launcher = deployed.launcher
    kubelets = {
        n: KubeletEmulator(
            hosts / n / "var/lib/kubelet/device-plugins",
            node=n,
            pod_resources=hosts / n / "var/lib/kubelet/pod-resources/kubelet.sock",
        )
        for n in NODES
    }
    # the node pods started before their kubelets: as after a kubelet restart, the plugins re-register
    async with KubeClient.from_settings(KubeSettings(kubeconfig=str(deployed.kubeconfig))) as kube:
        async with asyncio.TaskGroup() as tg:
            for kubelet in kubelets.values():
                await kubelet.start()
            for node in launcher.pod_names("hami-node"):
                launcher.pods[node].kill()
                launcher.pods[node].start()
            for kubelet in kubelets.values():
                await asyncio.wait_for(kubelet.wait_devices(GPU, 40), 60)
            runs = [tg.create_task(k.run_pods(kube)) for k in kubelets.values()]
            try:
                manifest = tmp_path / "pod.yaml"
                manifest.write_text(GPU_POD)
                done = await asyncio.to_thread(
                    subprocess.run,
                    [k8s["kubectl"], "--kubeconfig", str(deployed.kubeconfig), "apply", "-f", str(manifest)],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert done.returncode == 0, done.stderr
                pod = await kube.get_pod("default", "deployed-gpu")
                assert pod.spec.scheduler_name == "hami-scheduler"  # the deployed webhook, called by the apiserver

                async def bound() -> str:
                    return (await kube.get_pod("default", "deployed-gpu")).spec.node_name or ""

                node = await eventually(bound, timeout=180, what="the deployed kube-scheduler and extender bind it")
                admission = await asyncio.wait_for(kubelets[node].wait_admitted(pod.metadata.uid), 120)
                assert admission.ok, admission
                envs = admission.container("cuda").envs
                assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
                assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"
                placed = await kube.get_pod("default", "deployed-gpu")
                allocated = (placed.metadata.annotations or {})["hami.io/vgpu-devices-allocated"]
                assert envs["NVIDIA_VISIBLE_DEVICES"] in allocated
            finally:
                for run in runs:
                    run.cancel()
        for kubelet in kubelets.values():
            await kubelet.stop()
    # nothing crashed on the way: no container of any deployed pod exited on its own
    exits = {peer.name: peer.exits for p in launcher.pods.values() for peer in p.containers.values() if peer.exits}
    assert exits == {}, {
        name: launcher.pods[name.split("/")[0]].containers[name.split("/")[1]].tail(10) for name in exits
    }


def test_the_mapping_table_is_in_the_docs() -> None:
    """Every stand-in the launcher makes is written where a reader of the docs finds it."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "kube-emulator.md").read_text()
    missing = [what for what, _, _ in MAPPING if what not in docs]
    assert missing == []
