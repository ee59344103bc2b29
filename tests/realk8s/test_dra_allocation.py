"""A HAMi GPU pod in DRA mode goes all the way to allocated and bound on the real control plane (docs/dra.md).

The cluster of dra_support: real kube-apiserver, kube-controller-manager (resourceclaim controller + garbage
collector) and kube-scheduler with no extender, the dra component as shipped, our webhook in DRA mode, and
the ResourceSlices our node agent's publisher writes for a node with one fake 10000 MiB GPU, beside a node
without GPUs. The pods are written for HAMi (``nvidia.com/gpu: 1, nvidia.com/gpumem: 3000``): the resourceclaim
controller makes each its claim from the webhook's template, kube-scheduler allocates it from our slice with
the capacity it consumes and binds the pod. Three share the card; the fourth does not fit and stays pending
with the scheduler's reason until one of the three is deleted, its claim with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import msgspec
import pytest

from hami_common import envvars
from hami_common.allocation import NodeAllocationConfig, build_container
from hami_common.dra.names import DRIVER
from hami_common.dra.objects import ResourceSlice
from hami_common.dra.prepare import AllocatedClaim, claim_grant
from hami_common.dra.slices import MIB, node_slices, slice_name
from hami_common.quantity import value
from hami_common.resources import GPU, GPU_MEMORY
from hami_sim.realk8s import SYSTEM_NAMESPACE, ApiError, K8sBinaries
from hami_sim.waiting import eventually_sync
from tests.realk8s.conftest import controller_manager_or_skip
from tests.realk8s.dra_support import SLICES, WAIT_S, DraCluster, dra_cluster, missing

GPU_NODE: Final = "dra-gpu-node"
CPU_NODE: Final = "dra-cpu-node"
CARD_MIB: Final = 10000
ASK: Final = {GPU: "1", GPU_MEMORY: "3000"}
Json = dict[str, Any]


@pytest.fixture(scope="module")
def cluster(k8s: K8sBinaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DraCluster]:
    controller_manager_or_skip(k8s)
    gpu = {"uuid": "GPU-dra-0", "index": 0, "model": "NVIDIA A10", "memory_mib": CARD_MIB, "numa": 0}
    folder = tmp_path_factory.mktemp("dra-allocation")
    with dra_cluster(k8s, folder, {GPU_NODE: [gpu], CPU_NODE: []}, "dra-jobs") as running:
        yield running


def test_the_published_slice_passes_v1_validation_as_hami_dra_shapes_it(cluster: DraCluster) -> None:
    stored = cluster.plane.request("GET", f"{SLICES}/{slice_name(GPU_NODE, 0)}")
    spec = stored["spec"]
    assert (spec["driver"], spec["nodeName"], spec["pool"]["name"]) == (DRIVER, GPU_NODE, GPU_NODE)
    [device] = spec["devices"]
    assert device["name"] == "hami-gpu-0"
    assert device["attributes"]["type"] == {"string": "hami-gpu"}
    assert device["allowMultipleAllocations"] is True
    assert value(device["capacity"]["memory"]["value"]) == CARD_MIB * MIB
    assert stored["metadata"]["ownerReferences"][0]["name"] == GPU_NODE
    assert cluster.publishers[GPU_NODE].writes == 1  # the checking pass found it as written
    assert cluster.node_slices(CPU_NODE) == []


def test_the_node_account_writes_only_its_own_nodes_slices_of_hamis_driver(cluster: DraCluster) -> None:
    plane = cluster.plane
    token = cluster.node_tokens[GPU_NODE]
    devices = cluster.publishers[GPU_NODE].devices
    [other] = node_slices(CPU_NODE, devices, generation=1)
    [mine] = node_slices(GPU_NODE, devices, generation=1)
    foreign = msgspec.structs.replace(mine, spec=msgspec.structs.replace(mine.spec, driver="gpu.example.com"))

    def refused(token: str, body: ResourceSlice) -> str | None:
        try:  # a dry run: admission judges it, nothing is stored
            plane.request_as(token, "POST", f"{SLICES}?dryRun=All", msgspec.to_builtins(body))
        except ApiError as err:
            return f"{err.status} {err}"
        return None

    def forbidden(message: str | None, why: str) -> None:
        assert message is not None
        assert message.startswith("403 "), message
        assert why in message, message

    message = eventually_sync(lambda: refused(token, other), WAIT_S, "another node's slice refused")
    forbidden(message, "may write only the ResourceSlices of that node")
    forbidden(refused(token, foreign), "publish only the driver")
    unbound = plane.token(SYSTEM_NAMESPACE, "hami-node")  # a token not bound to a node
    forbidden(refused(unbound, mine), "no node-name claim")
    # its own node's, of HAMi's driver, under a name not taken yet: allowed
    spare = msgspec.structs.replace(mine, metadata=msgspec.structs.replace(mine.metadata, name=slice_name(GPU_NODE, 9)))
    assert refused(token, spare) is None


def test_three_hami_pods_share_one_card_the_fourth_waits_until_one_is_deleted(cluster: DraCluster) -> None:
    names = [f"infer-{i}" for i in range(4)]
    for name in names[:3]:
        cluster.create_pod(name, ASK)
    claims = {name: cluster.wait_bound(name) for name in names[:3]}

    shares: set[str] = set()
    for name, claim in claims.items():
        assert cluster.plane.request("GET", f"{cluster.pods}/{name}")["spec"]["nodeName"] == GPU_NODE
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"], result["device"]) == (DRIVER, GPU_NODE, "hami-gpu-0")
        # the apiserver writes quantities canonically (3145728k): compare their values
        consumed = result["consumedCapacity"]
        assert value(consumed["memory"]) == 3000 * MIB
        assert value(consumed["cores"]) == 0
        shares.add(result["shareID"])
        assert claim["metadata"]["ownerReferences"][0]["name"] == name  # made by the controller, owned by the pod
    assert len(shares) == 3  # three allocations of one device, each its own share
    _prepares_hami_cores_limits(cluster, claims[names[0]])

    cluster.create_pod(names[3], ASK)  # 4 x 3000 MiB > 10000 MiB
    reason = cluster.wait_unschedulable(names[3])
    assert reason.startswith("0/2 nodes are available: 2 cannot allocate all claims"), reason

    cluster.delete_pod(names[0])
    gone = claims[names[0]]["metadata"]["name"]
    eventually_sync(lambda: missing(cluster.plane, f"{cluster.claims}/{gone}"), WAIT_S, "the pod's claim deleted")
    claim = cluster.wait_bound(names[3])
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == "hami-gpu-0"


def _prepares_hami_cores_limits(cluster: DraCluster, claim: Json) -> None:
    """What the kubelet plugin's prepare (hami_common.dra.prepare; the service is not built) makes of a claim
    the real scheduler allocated: HAMi-core's limits for the card named by the published slice."""
    [stored] = cluster.node_slices(GPU_NODE)
    uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in stored["spec"]["devices"]}
    allocated = msgspec.convert(claim, AllocatedClaim)
    answer = build_container(allocated.metadata.uid, claim_grant(allocated, GPU_NODE, uuids), NodeAllocationConfig())
    assert answer.response.envs[envvars.NVIDIA_VISIBLE_DEVICES] == "GPU-dra-0"
    assert answer.response.envs[envvars.memory_limit(0)] == "3000m"
    assert answer.response.envs[envvars.CUDA_DEVICE_SM_LIMIT] == "0"  # cores unset: shared, not limited
