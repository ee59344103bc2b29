"""HAMi's device choices in DRA mode, judged by the real kube-scheduler on our published attributes (docs/dra.md).

One node with four fake GPUs: two on NUMA node 0 (a 24000 MiB A10 and an 8000 MiB T4) and two 24000 MiB A10s on
NUMA node 1. The webhook turns HAMi's annotations into CEL selectors and constraints on the attributes the node
agent publishes (uuid, productName, resource.kubernetes.io/numaNode); kube-scheduler allocates from them. A GPU
that turns unhealthy leaves the pool with the next generation, and comes back with the one after.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pytest
import yaml

from hami_common.annotations import NUMA_BIND, USE_GPUTYPE, USE_GPUUUID
from hami_common.resources import GPU, GPU_MEMORY
from hami_sim.realk8s import K8sBinaries
from tests.realk8s.conftest import controller_manager_or_skip
from tests.realk8s.dra_support import DraCluster, dra_cluster

Json = dict[str, Any]
NODE: Final = "dra-four-gpus"


def _gpu(index: int, numa: int, memory_mib: int, model: str = "NVIDIA A10", healthy: bool = True) -> Json:
    return {
        "uuid": f"GPU-four-{index}",
        "index": index,
        "model": model,
        "memory_mib": memory_mib,
        "numa": numa,
        "healthy": healthy,
    }


GPUS: Final = [_gpu(0, 0, 24000), _gpu(1, 0, 8000, "Tesla T4"), _gpu(2, 1, 24000), _gpu(3, 1, 24000)]


@pytest.fixture(scope="module")
def cluster(k8s: K8sBinaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraCluster]:
    controller_manager_or_skip(k8s)
    with dra_cluster(k8s, tmp_path_factory.mktemp("dra-devices"), {NODE: GPUS}, "dra-devices") as running:
        yield running


def _devices(claim: Json) -> list[str]:
    return sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])


def _allocated(
    cluster: DraCluster, name: str, limits: dict[str, str], annotations: dict[str, str] | None = None
) -> list[str]:
    """The devices the pod's claim was given; the pod is deleted again, so each test starts from free cards."""
    cluster.create_pod(name, limits, annotations)
    try:
        return _devices(cluster.wait_bound(name))
    finally:
        cluster.delete_pod(name)


def test_two_gpus_are_two_distinct_cards(cluster: DraCluster) -> None:
    devices = _allocated(cluster, "pair", {GPU: "2", GPU_MEMORY: "1000"})
    assert len(set(devices)) == 2, devices


def test_numa_bind_takes_two_cards_of_one_numa_node(cluster: DraCluster) -> None:
    # NUMA node 0's T4 is too small for 10000 MiB, so only node 1's pair fits: without the constraint a
    # first fit would pair hami-gpu-0 with a card of node 1
    devices = _allocated(cluster, "numa", {GPU: "2", GPU_MEMORY: "10000"}, {NUMA_BIND: "true"})
    assert devices == ["hami-gpu-2", "hami-gpu-3"]


def test_use_gpuuuid_and_use_gputype_pick_the_card_they_name(cluster: DraCluster) -> None:
    assert _allocated(cluster, "by-uuid", {GPU: "1", GPU_MEMORY: "1000"}, {USE_GPUUUID: "GPU-four-2"}) == ["hami-gpu-2"]
    assert _allocated(cluster, "by-type", {GPU: "1", GPU_MEMORY: "1000"}, {USE_GPUTYPE: "T4"}) == ["hami-gpu-1"]


def test_an_unhealthy_card_leaves_the_pool_and_comes_back(cluster: DraCluster) -> None:
    asks = {GPU: "1", GPU_MEMORY: "1000"}, {USE_GPUUUID: "GPU-four-3"}
    sick = [_gpu(0, 0, 24000), _gpu(1, 0, 8000, "Tesla T4"), _gpu(2, 1, 24000), _gpu(3, 1, 24000, healthy=False)]
    cluster.inventory.write_text(yaml.safe_dump({"nodes": {NODE: sick}}))
    try:
        cluster.publish(NODE)  # a restarted agent: it takes the node's slice over with the next generation
        [stored] = cluster.node_slices(NODE)
        assert stored["spec"]["pool"]["generation"] == 2
        assert [d["name"] for d in stored["spec"]["devices"]] == ["hami-gpu-0", "hami-gpu-1", "hami-gpu-2"]
        cluster.create_pod("wants-3", *asks)
        assert "cannot allocate all claims" in cluster.wait_unschedulable("wants-3")
    finally:
        cluster.inventory.write_text(yaml.safe_dump({"nodes": {NODE: GPUS}}))
    cluster.publish(NODE)
    [stored] = cluster.node_slices(NODE)
    assert stored["spec"]["pool"]["generation"] == 3
    assert _devices(cluster.wait_bound("wants-3")) == ["hami-gpu-3"]
