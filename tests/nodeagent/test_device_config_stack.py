"""HAMi's device config through the local stack (issue 18.1, 18.2): one file, every service.

The stack runs the real webhook, extender, node agents, allocators, NATS and kubelet emulators, all given the
same ``--device-config-file``. A per-node ``devicesplitcount`` must be what the node agent registers *and*
what the allocator advertises to the kubelet; a renamed resource (``nvidia.com/cores``) must be admitted,
scheduled and allocated with the limits it asked for.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_common import envvars
from hami_common.annotations import NODE_REGISTER, decode_node_devices
from hami_sim.stack import LocalCluster, StackConfig

GPUS = 2
SPLIT_NODE = "gpu-node-0"
OTHER_NODE = "gpu-node-1"
DEVICE_CONFIG = f"""
nvidia:
  resourceCountName: nvidia.com/vgpu
  resourceMemoryName: nvidia.com/vgpu-memory
  resourceCoreName: nvidia.com/cores
  deviceSplitCount: 5
nodeconfig:
- name: {SPLIT_NODE}
  devicesplitcount: 3
"""


@pytest.fixture
def sockdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hami-dc-") as folder:
        yield Path(folder)


def _config(tmp_path: Path, sockdir: Path) -> StackConfig:
    path = tmp_path / "device-config.yaml"
    path.write_text(DEVICE_CONFIG)
    return StackConfig(
        workdir=tmp_path / "stack", sockdir=sockdir, nodes=2, gpus_per_node=GPUS, device_config_file=path
    )


@pytest.mark.timeout(120)
async def test_node_with_devicesplitcount_3_registers_3_and_its_kubelet_sees_3_per_gpu(
    tmp_path: Path, sockdir: Path
) -> None:
    async with LocalCluster(_config(tmp_path, sockdir)) as cluster:  # start waits for every kubelet's devices
        for name, split in ((SPLIT_NODE, 3), (OTHER_NODE, 5)):
            node = await cluster.kube.get_node(name)
            registered = decode_node_devices(node.metadata.annotations[NODE_REGISTER])
            assert [d.count for d in registered] == [split] * GPUS
            plugin = cluster.nodes[name].kubelet.plugins["nvidia.com/vgpu"]
            assert len(plugin.healthy) == split * GPUS


@pytest.mark.timeout(120)
async def test_pod_asking_for_renamed_resources_is_scheduled_and_allocated_its_limits(
    tmp_path: Path, sockdir: Path
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "renamed", "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "cuda",
                    "resources": {
                        "limits": {"nvidia.com/vgpu": "1", "nvidia.com/vgpu-memory": "3000", "nvidia.com/cores": "30"}
                    },
                }
            ]
        },
    }
    async with LocalCluster(_config(tmp_path, sockdir)) as cluster:
        created = await cluster.submit(pod)
        assert created["spec"]["schedulerName"] == "hami-scheduler"  # the webhook saw a GPU pod
        uid = created["metadata"]["uid"]
        admitted = (await cluster.wait_admitted({uid}))[uid]
        assert admitted.admission.ok, admitted.admission
        envs = admitted.admission.container("main").envs
        assert envs[envvars.memory_limit(0)] == "3000m"
        assert envs[envvars.CUDA_DEVICE_SM_LIMIT] == "30"
        assert cluster.failures() == {}
