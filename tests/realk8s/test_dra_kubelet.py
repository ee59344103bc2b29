"""The real kubelet deletes its node's ResourceSlices when it starts; the node agent's next check puts them back.

kubelet v1.37's DRA plugin manager wipes every slice of the node at start (no DRA driver has registered with
it yet), and our node agent is not a registered kubelet plugin: docs/dra.md says the publisher's periodic
check (every registration interval) restores the pool. This runs the real kubelet (harness RealKubelet, on a
fake runtime) against slices published for its node before it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
import yaml

from hami_common.inventory import FakeInventory
from hami_common.kube import KubeClient, KubeSettings
from hami_nodeagent.draslices import KubeSlices, SlicePublisher
from hami_sim.realk8s import ApiError, ControlPlane, RealKubelet, mount_namespaces_work
from hami_sim.waiting import eventually_sync
from tests.realk8s.dra_support import SLICES, WAIT_S

NODE: Final = "dra-kubelet-node"

pytestmark = pytest.mark.skipif(
    not mount_namespaces_work(), reason="the real kubelet needs a private mount namespace (root, unshare --mount)"
)


@pytest.fixture
def kubelet(plane: ControlPlane, sockdir: Path) -> Iterator[RealKubelet]:
    # a short folder: the kubelet's unix sockets live under it, and a socket path is at most 107 bytes
    running = RealKubelet(plane, NODE, sockdir / "kubelet")
    try:
        yield running
    finally:
        running.stop()
        # the session's plane runs no garbage collector: the node and its slices go by hand
        for name in _slices(plane):
            plane.request("DELETE", f"{SLICES}/{name}")
        with contextlib.suppress(ApiError):
            plane.request("DELETE", f"/api/v1/nodes/{NODE}")


def _slices(plane: ControlPlane) -> list[str]:
    items = plane.request("GET", f"{SLICES}?fieldSelector=spec.nodeName%3D{NODE}")["items"]
    return [item["metadata"]["name"] for item in items]


async def _sync(admin: Path, inventory: Path, publisher: SlicePublisher | None, *, check: bool) -> SlicePublisher:
    async with KubeClient.from_settings(KubeSettings(kubeconfig=str(admin))) as kube:
        if publisher is None:
            publisher = SlicePublisher(node=NODE, inventory=FakeInventory(inventory, NODE), store=KubeSlices(kube))
        else:
            publisher.store = KubeSlices(kube)  # the same publisher (what it wrote), on this loop's client
        await publisher.sync(check=check)
        return publisher


def test_slices_wiped_by_a_starting_kubelet_come_back_at_the_agents_next_check(
    plane: ControlPlane, kubelet: RealKubelet, tmp_path: Path
) -> None:
    admin = plane.write_kubeconfig(tmp_path / "admin")
    inventory = tmp_path / "inventory.yaml"
    gpu = {"uuid": "GPU-kubelet-0", "index": 0, "model": "NVIDIA A10", "memory_mib": 24000}
    inventory.write_text(yaml.safe_dump({"nodes": {NODE: [gpu]}}))
    plane.create("", "v1", "nodes", None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    publisher = asyncio.run(_sync(admin, inventory, None, check=True))
    assert _slices(plane) != []

    kubelet.start()
    eventually_sync(lambda: _slices(plane) == [], WAIT_S, "the starting kubelet deletes the node's slices")
    asyncio.run(_sync(admin, inventory, publisher, check=False))
    assert _slices(plane) == []  # a poll without a check trusts what it wrote
    asyncio.run(_sync(admin, inventory, publisher, check=True))
    [name] = _slices(plane)
    stored = plane.request("GET", f"{SLICES}/{name}")
    assert stored["spec"]["pool"]["generation"] == 2
    assert [d["name"] for d in stored["spec"]["devices"]] == ["hami-gpu-0"]
