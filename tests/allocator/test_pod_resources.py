"""Allocate asks the kubelet's PodResources List which pod it is for (emulated kubelet and apiserver).

The same scenario runs on the real kubelet in ``tests/realk8s/test_kubelet.py``; here the emulated kubelet
serves List as the real one does (active pods, each app container with the device IDs it holds)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hami_allocator.admitting import ask_kubelet
from hami_allocator.inventory import DeclaredInventory
from hami_common import envvars
from hami_common.allocation import NodeAllocationConfig
from hami_common.annotations import ContainerDevice
from hami_common.errors import TransientError
from hami_common.kube import KubeClient
from hami_common.podresources import PodResourcesClient
from hami_common.resources import GPU
from hami_common.staging import StagingStore
from hami_sim.kubelet import KubeletEmulator
from tests.allocator.conftest import GPUS, NODE, SPLIT, bound_pod_body, grant_of, node_body, running_allocator, stage
from tests.allocator.test_fallback import create


def dev(uuid: str, mem: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=mem, usedcores=cores)


@pytest.fixture
async def listing_kubelet(sockdir: Path) -> AsyncIterator[KubeletEmulator]:
    async with KubeletEmulator(sockdir, node=NODE, pod_resources=sockdir / "pr" / "kubelet.sock") as emulated:
        yield emulated


def thief_body() -> dict[str, Any]:
    """A pod bound to the node by hand: it asks for a GPU and holds no grant."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "thief", "namespace": "default", "annotations": {}},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {GPU: "1"}}}],
        },
    }


@pytest.mark.parametrize("thief_first", [True, False])
async def test_a_pod_without_a_grant_never_gets_the_staged_grant_of_another(
    sockdir: Path,
    listing_kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    kube: KubeClient,
    core: Any,
    thief_first: bool,
) -> None:
    await create(core, node_body())
    rightful = await create(core, bound_pod_body("rightful", {"main": [dev(GPUS[1], 5000, 50)]}, bind_time=10))
    stage(store, grant_of(rightful, ("main", ((GPUS[1], 5000, 50),)), name="rightful"), alloc_config, 10)
    made = await asyncio.to_thread(core.create_namespaced_pod, "default", thief_body())
    thief = str(made.metadata.uid)
    lister = PodResourcesClient(str(listing_kubelet.pod_resources))
    async with running_allocator(
        sockdir, store=store, config=alloc_config, inventory=inventory, kube=kube, kubelet_pods=lister.list
    ) as svc:
        await listing_kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        order = ("thief", "rightful") if thief_first else ("rightful", "thief")
        admitted = {name: await listing_kubelet.admit(await kube.get_pod("default", name)) for name in order}
        await svc.followup.join()
    await lister.close()
    assert not admitted["thief"].ok
    assert "pod default/thief, which the kubelet is admitting, holds no grant" in admitted["thief"].containers[0].error
    assert admitted["rightful"].ok
    envs = admitted["rightful"].container("main").envs
    assert envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[1]
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5000m"
    assert store.staged_uids() == []
    assert svc.allocator.refused_unknown == 0  # the thief was told apart, not left unknown
    assert thief not in svc.allocator.inflight


async def test_without_an_answer_from_the_kubelet_nothing_is_handed_out(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    kube: KubeClient,
    core: Any,
) -> None:
    """The PodResources socket is configured but nobody serves it: fail closed, UNAVAILABLE, staged entry kept."""
    await create(core, node_body())
    rightful = await create(core, bound_pod_body("rightful", {"main": [dev(GPUS[0], 1000, 10)]}, bind_time=10))
    stage(store, grant_of(rightful, ("main", ((GPUS[0], 1000, 10),)), name="rightful"), alloc_config, 10)
    lister = PodResourcesClient(str(sockdir / "nobody" / "kubelet.sock"), timeout=0.5)
    async with running_allocator(
        sockdir, store=store, config=alloc_config, inventory=inventory, kube=kube, kubelet_pods=lister.list
    ) as svc:
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        admission = await kubelet.admit(await kube.get_pod("default", "rightful"))
    await lister.close()
    (refused,) = admission.containers
    assert refused.error.startswith("UNAVAILABLE")
    assert "cannot ask the kubelet which pod this Allocate is for" in refused.error
    assert store.staged_uids() == [rightful]  # nothing consumed: the kubelet's retry can still be served
    assert svc.allocator.refused_unknown == 1


async def test_a_reply_that_does_not_decode_is_an_unavailable_kubelet_not_a_crash(sockdir: Path) -> None:
    """The kubelet's List answered with bytes that are no ListPodResourcesResponse: one clear error."""
    path = sockdir / "garbled.sock"
    server = grpc.aio.server()

    async def garbled(request: Any, context: Any) -> bytes:
        return b"\xff\xff\xff"

    handler = grpc.unary_unary_rpc_method_handler(garbled, response_serializer=lambda raw: raw)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": handler}),))
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    lister = PodResourcesClient(str(path))
    try:
        with pytest.raises(TransientError, match="cannot ask the kubelet which pod this Allocate is for"):
            await ask_kubelet(lister.list, 5.0)
    finally:
        await lister.close()
        await server.stop(None)
