"""A mixed cluster in the local stack (``hami up --vendors nvidia,ascend,cambricon,hygon``): one NVIDIA node and
one node per other vendor, each pod placed on its vendor's node and admitted with its plugin's answer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from hami_cli.up import example_paths
from hami_sim.stack import LocalCluster, StackConfig

ROOT = Path(__file__).resolve().parents[2]
VENDORS = ("nvidia", "ascend", "cambricon", "hygon")


def _pod(name: str, limits: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}]},
    }


def _example(vendor: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "vendors" / f"{vendor}.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


def test_vendor_examples_are_submitted_only_with_their_vendor() -> None:
    examples = ROOT / "examples"
    assert example_paths(examples, ("nvidia",)) == [examples]
    assert example_paths(examples, VENDORS)[1:] == [examples / "vendors" / f"{v}.yaml" for v in VENDORS[1:]]


async def test_each_pod_lands_on_its_vendors_node(tmp_path: Path, sockdir: Path) -> None:
    config = StackConfig(
        workdir=tmp_path / "stack",
        sockdir=sockdir,
        nodes=1,
        gpus_per_node=2,
        vendors=VENDORS,
        vendor_devices_per_node=2,
        node_hosts=0,
    )
    async with LocalCluster(config) as cluster:
        pods = {
            "nvidia": _pod("nvidia-slice", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2000}),
            **{v: _example(v) for v in VENDORS[1:]},
        }
        created = {v: await cluster.submit(p) for v, p in pods.items()}
        uids = {v: c["metadata"]["uid"] for v, c in created.items()}
        async with asyncio.timeout(60):
            admitted = await cluster.wait_admitted(uids.values())
        nodes = {v: admitted[uid].node for v, uid in uids.items()}
        assert nodes == {
            "nvidia": "gpu-node-0",
            "ascend": "ascend-node-0",
            "cambricon": "cambricon-node-0",
            "hygon": "hygon-node-0",
        }
        for vendor, uid in uids.items():
            assert admitted[uid].admission.ok, (vendor, admitted[uid].admission)
        ascend = admitted[uids["ascend"]].admission.containers[0]
        assert ascend.envs["ASCEND_VNPU_SPECS"] == "vir05_1c_16g"
        hygon = admitted[uids["hygon"]].admission.containers[0]
        assert hygon.response is not None
        assert "/etc/vdev/docker/" in [m.container_path for m in hygon.response.mounts]
        mlu = admitted[uids["cambricon"]].admission
        assert {c.name for c in mlu.containers} == {"main"}
        assert any(d.container_path == "/dev/cambricon_ctl" for d in mlu.containers[0].response.devices)  # type: ignore[union-attr]
