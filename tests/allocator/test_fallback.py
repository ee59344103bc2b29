"""The annotation fallback and the follow-up writes, against the kube emulator: no node agent, no NATS."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hami_allocator.followup import FollowUp, Served, release_node_lock
from hami_allocator.inventory import DeclaredInventory
from hami_allocator.service import serve
from hami_allocator.settings import AllocatorSettings
from hami_common import envvars
from hami_common.allocation import NodeAllocationConfig
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_FAILED,
    BIND_PHASE_SUCCESS,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    GRANT_SIGNATURE,
    NODE_LOCK,
    NODE_PLACEMENTS,
    NODE_PLACEMENTS_BUS,
    VGPU_NODE,
    ContainerDevice,
    decode_pod_devices,
    encode_pod_devices,
)
from hami_common.kube import AnnotationChanges, JsonPatchOp, KubeClient, Node, Pod, PodStatus
from hami_common.resources import GPU
from hami_common.staging import StagingStore
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.kubelet import KubeletEmulator
from hami_sim.waiting import eventually
from tests.allocator.conftest import (
    GPUS,
    GRANT_KEY,
    NODE,
    SPLIT,
    bound_pod_body,
    grant_of,
    node_body,
    running_allocator,
    signature_of,
    stage,
)


def dev(uuid: str, mem: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=mem, usedcores=cores)


async def create(core: Any, body: dict[str, Any]) -> str:
    if body["kind"] == "Node":
        await asyncio.to_thread(core.create_node, body)
        return ""
    meta = body["metadata"]
    created = await asyncio.to_thread(core.create_namespaced_pod, meta["namespace"], body)
    uid = str(created.metadata.uid)
    if meta["annotations"].get(GRANT_SIGNATURE) is None:  # signed as the extender does once the UID is known
        patch = {"metadata": {"annotations": {GRANT_SIGNATURE: signature_of(uid, meta["annotations"])}}}
        await asyncio.to_thread(core.patch_namespaced_pod, meta["name"], meta["namespace"], patch)
    return uid


async def test_fallback_serves_the_pending_pod_then_erases_marks_success_and_releases_the_lock(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    kube: KubeClient,
    core: Any,
) -> None:
    await create(core, node_body(lock_holder=("default", "train")))
    body = bound_pod_body(
        "train", {"a": [dev(GPUS[0], 3000, 30)], "b": [dev(GPUS[0], 5000, 0), dev(GPUS[1], 5000, 0)]}, bind_time=10
    )
    uid = await create(core, body)
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory, kube=kube) as svc:
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        watcher = asyncio.create_task(kubelet.run_pods(kube))
        admission = await kubelet.wait_admitted(uid)
        await svc.followup.join()
        watcher.cancel()
    assert admission.ok, admission
    a, b = admission.container("a").envs, admission.container("b").envs
    assert (a[envvars.NVIDIA_VISIBLE_DEVICES], a["CUDA_DEVICE_MEMORY_LIMIT_0"], a[envvars.CUDA_DEVICE_SM_LIMIT]) == (
        GPUS[0],
        "3000m",
        "30",
    )
    assert b[envvars.NVIDIA_VISIBLE_DEVICES] == ",".join(GPUS)
    assert (b["CUDA_DEVICE_MEMORY_LIMIT_0"], b["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("5000m", "5000m")
    assert svc.allocator.served_fallback == 2
    pod = await kube.get_pod("default", "train")
    # every entry erased; like HAMi, each decode-pop-encode keeps one more trailing empty entry
    assert pod.metadata.annotations[DEVICES_TO_ALLOCATE] == ";;;;"
    assert pod.metadata.annotations[DEVICES_ALLOCATED] == body["metadata"]["annotations"][DEVICES_ALLOCATED]
    assert pod.metadata.annotations[BIND_PHASE] == BIND_PHASE_SUCCESS
    node = await kube.get_node(NODE)
    assert NODE_LOCK not in node.metadata.annotations


async def test_a_forged_grant_on_a_pod_that_skipped_the_scheduler_is_refused(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    kube: KubeClient,
    core: Any,
) -> None:
    """HAMi#3041: a pod created with spec.nodeName and hand-written annotations (80000 MiB on an 8000 MiB card),
    as a tenant can when admission skips it. HAMi's plugin serves it; ours refuses it, marks nothing, and
    serves the next pod the scheduler did place.

    (``Allocate`` does not name its pod, so a forged pod admitted while a signed pod waits on the same node
    would be handed that pod's signed grant, limits included: admission keeps GPU pods with a preset
    ``spec.nodeName`` away from the kubelet for that reason, in the webhook and the ValidatingAdmissionPolicy.)
    """
    await create(core, node_body())
    forged = bound_pod_body("forged", {"main": [dev(GPUS[0], 80000, 100)]}, bind_time=5)
    forged["metadata"]["annotations"][GRANT_SIGNATURE] = "v1.bm90IHRoZSBzY2hlZHVsZXI"
    forged_uid = await create(core, forged)
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory, kube=kube) as svc:
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        watcher = asyncio.create_task(kubelet.run_pods(kube))
        refused = await kubelet.wait_admitted(forged_uid)
        honest_uid = await create(core, bound_pod_body("honest", {"main": [dev(GPUS[1], 3000, 30)]}, bind_time=10))
        served = await kubelet.wait_admitted(honest_uid)
        await svc.followup.join()
        watcher.cancel()
    assert not refused.ok
    assert "default/forged not served: the hami.io/vgpu-grant signature does not match" in refused.containers[0].error
    assert served.ok, served
    assert served.container("main").envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert svc.allocator.served_fallback == 1
    assert (await kube.get_pod("default", "forged")).metadata.annotations[BIND_PHASE] != BIND_PHASE_SUCCESS


async def test_two_pods_bound_back_to_back_each_get_their_own_devices_by_fallback(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    kube: KubeClient,
    core: Any,
) -> None:
    await create(core, node_body())
    first = await create(core, bound_pod_body("first", {"main": [dev(GPUS[0], 1000, 10)]}, bind_time=10))
    second = await create(core, bound_pod_body("second", {"main": [dev(GPUS[1], 2000, 20)]}, bind_time=11))
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory, kube=kube) as svc:
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        watcher = asyncio.create_task(kubelet.run_pods(kube))
        one, two = await kubelet.wait_admitted(first), await kubelet.wait_admitted(second)
        await svc.followup.join()
        watcher.cancel()
    assert one.container("main").envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[0]
    assert two.container("main").envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[1]
    assert two.container("main").envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    for name in ("first", "second"):
        assert (await kube.get_pod("default", name)).metadata.annotations[BIND_PHASE] == BIND_PHASE_SUCCESS


async def test_staged_entry_of_a_pod_deleted_meanwhile_is_never_handed_out(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    kube: KubeClient,
    core: Any,
) -> None:
    await create(core, node_body())
    doomed = await create(core, bound_pod_body("doomed", {"main": [dev(GPUS[0], 1000, 10)]}, bind_time=10))
    kept = await create(core, bound_pod_body("kept", {"main": [dev(GPUS[1], 2000, 20)]}, bind_time=11))
    stage(store, grant_of(doomed, ("main", ((GPUS[0], 1000, 10),)), name="doomed"), alloc_config, 10)
    stage(store, grant_of(kept, ("main", ((GPUS[1], 2000, 20),)), name="kept"), alloc_config, 11)
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory, kube=kube) as svc:
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        # deleted once the plugin's watch holds the pod: a pod gone before the watch listed is never seen to go
        pods = svc.pods
        assert pods is not None
        await eventually(lambda: pods.get("default", "doomed") is not None, what="the watch listed the pod")
        await asyncio.to_thread(core.delete_namespaced_pod, "doomed", "default")
        await eventually(lambda: doomed in svc.allocator.gone, what="the plugin saw the deletion")
        pod = await kube.get_pod("default", "kept")
        admission = await kubelet.admit(pod)
        await svc.followup.join()
    assert admission.container("main").envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[1]
    assert svc.allocator.served_staged == 1
    assert store.staged_uids() == []
    assert (await kube.get_pod("default", "kept")).metadata.annotations[BIND_PHASE] == BIND_PHASE_SUCCESS


async def test_pod_with_a_malformed_device_list_is_refused_and_marked_failed(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    kube: KubeClient,
    core: Any,
) -> None:
    await create(core, node_body(lock_holder=("default", "broken")))
    body = bound_pod_body("broken", {"main": [dev(GPUS[0], 1000, 10)]}, bind_time=10)
    body["metadata"]["annotations"][DEVICES_TO_ALLOCATE] = "GPU-x,NVIDIA,lots,0:;"
    uid = await create(core, body)
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory, kube=kube) as svc:
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        admission = await kubelet.admit(await kube.get_pod("default", "broken"))
        await svc.followup.join()
    assert admission.uid == uid
    assert not admission.ok
    assert admission.containers[0].error.startswith("INVALID_ARGUMENT")
    assert "memory 'lots'" in admission.containers[0].error
    assert (await kube.get_pod("default", "broken")).metadata.annotations[BIND_PHASE] == BIND_PHASE_FAILED
    assert NODE_LOCK not in (await kube.get_node(NODE)).metadata.annotations


async def test_the_service_allocates_by_fallback_while_nats_is_unreachable(
    sockdir: Path, tmp_path: Path, emulator: KubeApiEmulator, kube: KubeClient, core: Any
) -> None:
    await create(core, node_body(lock_holder=("default", "solo")))
    uid = await create(core, bound_pod_body("solo", {"main": [dev(GPUS[1], 4000, 40)]}, bind_time=10))
    key_file = tmp_path / "grant-key"
    key_file.write_bytes(GRANT_KEY.secret + b"\n")
    settings = AllocatorSettings(
        node_name=NODE,
        plugin_dir=str(sockdir),
        gpus=GPUS,
        device_split_count=SPLIT,
        socket_name="vgpu.sock",
        staging_dir=str(tmp_path / "staging"),
        hook_path=str(tmp_path / "hook"),
        watch_interval=0.02,
        kubeconfig=str(emulator.write_kubeconfig(tmp_path / "kubeconfig-svc")),
        nats_url="nats://127.0.0.1:1",
        grant_key_file=str(key_file),
    )
    stop = asyncio.Event()
    async with KubeletEmulator(sockdir, node=NODE) as kubelet:
        body = asyncio.create_task(serve(settings, stop))
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        watcher = asyncio.create_task(kubelet.run_pods(kube))
        admission = await kubelet.wait_admitted(uid)

        async def lock_released() -> bool:
            return NODE_LOCK not in (await kube.get_node(NODE)).metadata.annotations

        await eventually(lock_released, what="the node lock is released")  # the service's follow-up is internal
        watcher.cancel()
        stop.set()
        await body
    assert admission.container("main").envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4000m"
    assert (await kube.get_pod("default", "solo")).metadata.annotations[BIND_PHASE] == BIND_PHASE_SUCCESS


async def test_preferred_allocation_steers_the_kubelet_to_the_annotated_gpu_without_staging(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    kube: KubeClient,
    core: Any,
) -> None:
    await create(core, node_body())
    await create(core, bound_pod_body("steered", {"main": [dev(GPUS[1], 1000, 10)]}, bind_time=10))
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory, kube=kube) as svc:
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        cache = svc.pods
        assert cache is not None
        await eventually(lambda: cache.get("default", "steered"), what="the plugin's watch holds the pod")
        admission = await kubelet.admit(await kube.get_pod("default", "steered"))
        await svc.followup.join()
    assert admission.container("main").device_ids == (f"{GPUS[1]}-0",)  # not the kubelet's first free device
    assert admission.container("main").envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[1]


async def test_a_placement_staged_after_the_fallback_served_it_is_not_handed_to_the_next_pod(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    kube: KubeClient,
    core: Any,
) -> None:
    await create(core, node_body())
    first = await create(core, bound_pod_body("first", {"main": [dev(GPUS[0], 1000, 10)]}, bind_time=10))
    await create(core, bound_pod_body("second", {"main": [dev(GPUS[1], 2000, 20)]}, bind_time=11))
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory, kube=kube) as svc:
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        one = await kubelet.admit(await kube.get_pod("default", "first"))  # nothing staged yet: the fallback
        # the node agent stages the first pod's placement only now, late
        stage(store, grant_of(first, ("main", ((GPUS[0], 1000, 10),)), name="first"), alloc_config, 10)
        two = await kubelet.admit(await kube.get_pod("default", "second"))
        await svc.followup.join()
    assert one.container("main").envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[0]
    assert two.container("main").envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[1]


class _Counting:
    """The client, counting the reads and writes the follow-up makes of pods."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.reads = 0
        self.writes = 0

    async def get_pod(self, namespace: str, name: str) -> Pod:
        self.reads += 1
        return await self.kube.get_pod(namespace, name)

    async def patch_pod_annotations(
        self, namespace: str, name: str, changes: AnnotationChanges, *, resource_version: str = ""
    ) -> Pod:
        self.writes += 1
        return await self.kube.patch_pod_annotations(namespace, name, changes, resource_version=resource_version)

    async def patch_pod_guarded(self, namespace: str, name: str, ops: list[JsonPatchOp]) -> Pod:
        self.writes += 1
        return await self.kube.patch_pod_guarded(namespace, name, ops)


async def test_follow_up_from_a_stale_copy_of_the_pod_erases_the_right_entry(kube: KubeClient, core: Any) -> None:
    """The erasure first writes on the watch's copy of the pod; when that copy is behind the apiserver (here
    it still shows container a's entry, erased meanwhile), the write is refused (its condition is the list it
    erases from) and made once more on one fresh read, never on the stale list."""
    await create(core, node_body(lock_holder=("default", "late")))
    body = bound_pod_body("late", {"a": [dev(GPUS[0], 1000, 10)], "b": [dev(GPUS[1], 2000, 20)]}, bind_time=10)
    uid = await create(core, body)
    stale = await kube.get_pod("default", "late")
    rest = encode_pod_devices([[], [dev(GPUS[1], 2000, 20)]])  # container a served and erased meanwhile
    await kube.patch_pod_annotations("default", "late", {DEVICES_TO_ALLOCATE: rest})
    counting = _Counting(kube)
    followup = FollowUp(NODE, pods=counting, nodes=kube, known_pod=lambda namespace, name: stale)
    worker = asyncio.create_task(followup.run())
    followup.submit(
        Served(pod_uid=uid, namespace="default", name="late", container="b", device_uuids=(GPUS[1],), staged=True)
    )
    await followup.join()
    worker.cancel()
    annotations = (await kube.get_pod("default", "late")).metadata.annotations
    assert not any(decode_pod_devices(annotations[DEVICES_TO_ALLOCATE]))
    assert annotations[BIND_PHASE] == BIND_PHASE_SUCCESS
    assert NODE_LOCK not in (await kube.get_node(NODE)).metadata.annotations
    assert (counting.reads, counting.writes) == (1, 2)
    assert followup.failures == 0


async def test_follow_up_is_one_write_after_a_status_write_it_has_not_seen(kube: KubeClient, core: Any) -> None:
    """The kubelet reports the pod's status while the allocator serves it, so the watch's copy is older than
    the pod: the erasure is conditional on the list it erases from, not on the whole pod, and is one write
    (it was a refused write and a read first). A pod whose Binding brought the placement (no label) gets
    HAMi's ``hami.io/vgpu-node`` label with it; each container's erasure starts from the one before it."""
    await create(core, node_body())
    body = bound_pod_body("p", {"a": [dev(GPUS[0], 1000, 10)], "b": [dev(GPUS[1], 2000, 20)]}, bind_time=10)
    body["metadata"]["labels"] = {"app": "trainer"}
    uid = await create(core, body)
    watched = await kube.get_pod("default", "p")
    await kube.patch_pod_status("default", "p", PodStatus(phase="Pending", message="kubelet was here"))
    counting = _Counting(kube)
    followup = FollowUp(NODE, pods=counting, nodes=kube, known_pod=lambda namespace, name: watched)
    worker = asyncio.create_task(followup.run())
    for container, gpu in (("a", GPUS[0]), ("b", GPUS[1])):
        followup.submit(
            Served(pod_uid=uid, namespace="default", name="p", container=container, device_uuids=(gpu,), staged=True)
        )
    await followup.join()
    worker.cancel()
    pod = await kube.get_pod("default", "p")
    assert not any(decode_pod_devices(pod.metadata.annotations[DEVICES_TO_ALLOCATE]))
    assert pod.metadata.annotations[BIND_PHASE] == BIND_PHASE_SUCCESS
    assert pod.metadata.labels == {"app": "trainer", VGPU_NODE: NODE}
    assert (counting.reads, counting.writes) == (0, 2)
    assert followup.failures == 0


async def test_follow_up_waits_out_an_apiserver_restart_then_records_and_releases(
    kube: KubeClient, core: Any, emulator: KubeApiEmulator
) -> None:
    """A kube-apiserver restart takes seconds. A follow-up that gave up meanwhile left bind-phase at
    allocating and HAMi's lock on the node, so every later pod of the node waited out the 5-minute expiry."""
    await create(core, node_body(lock_holder=("default", "p")))
    uid = await create(core, bound_pod_body("p", {"main": [dev(GPUS[0], 1000, 10)]}, bind_time=10))
    followup = FollowUp(NODE, pods=kube, nodes=kube)
    worker = asyncio.create_task(followup.run())
    emulator.stop()
    followup.submit(
        Served(pod_uid=uid, namespace="default", name="p", container="main", device_uuids=(GPUS[0],), staged=True)
    )
    await asyncio.sleep(5)  # longer than the retries of one request
    emulator.start()
    async with asyncio.timeout(30):
        await followup.join()
    worker.cancel()
    assert followup.failures == 0
    assert (await kube.get_pod("default", "p")).metadata.annotations[BIND_PHASE] == BIND_PHASE_SUCCESS
    assert NODE_LOCK not in (await kube.get_node(NODE)).metadata.annotations


async def test_node_lock_is_released_whatever_the_watch_last_saw_of_the_node(kube: KubeClient, core: Any) -> None:
    """The release first works on the watch's copy of the node; a copy from before the lock was taken, or
    one that is behind the apiserver, still ends with this pod's lock released and no other change lost."""
    await create(core, node_body())
    before_lock = await kube.get_node(NODE)
    lock = node_body(lock_holder=("default", "mine"))["metadata"]["annotations"][NODE_LOCK]
    await kube.patch_node_annotations(NODE, {NODE_LOCK: lock})
    assert await release_node_lock(kube, NODE, "default", "mine", known=before_lock)
    assert NODE_LOCK not in (await kube.get_node(NODE)).metadata.annotations

    await kube.patch_node_annotations(NODE, {NODE_LOCK: lock})
    locked = await kube.get_node(NODE)
    await kube.patch_node_annotations(NODE, {"example.com/other": "kept"})  # the copy is now stale
    assert await release_node_lock(kube, NODE, "default", "mine", known=locked)
    annotations = (await kube.get_node(NODE)).metadata.annotations
    assert NODE_LOCK not in annotations
    assert annotations["example.com/other"] == "kept"

    await kube.patch_node_annotations(NODE, {NODE_LOCK: lock})
    assert not await release_node_lock(kube, NODE, "default", "another", known=await kube.get_node(NODE))
    assert (await kube.get_node(NODE)).metadata.annotations[NODE_LOCK] == lock


class _CountedReads:
    """The real client, with the node reads it made counted."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.node_reads = 0

    async def get_node(self, name: str) -> Node:
        self.node_reads += 1
        return await self.kube.get_node(name)

    async def patch_node_annotations(
        self, name: str, changes: AnnotationChanges, *, resource_version: str = ""
    ) -> Node:
        return await self.kube.patch_node_annotations(name, changes, resource_version=resource_version)


@pytest.mark.parametrize("marked", [True, False], ids=["bus-served node", "HAMi's way"])
async def test_a_node_marked_as_served_over_the_bus_is_not_read_for_a_lock_nobody_took(
    kube: KubeClient, core: Any, marked: bool
) -> None:
    """On a node whose node agent says placements come over the bus, the scheduler takes no HAMi lock, so
    the follow-up does not read the node to find one (a GET per allocation); elsewhere it still does."""
    body = node_body()
    if marked:
        body["metadata"]["annotations"][NODE_PLACEMENTS] = NODE_PLACEMENTS_BUS
    await create(core, body)
    uid = await create(core, bound_pod_body("p", {"main": [dev(GPUS[0], 1000, 10)]}, bind_time=10))
    known = await kube.get_node(NODE)
    nodes = _CountedReads(kube)
    followup = FollowUp(NODE, pods=kube, nodes=nodes, known_node=lambda: known)
    worker = asyncio.create_task(followup.run())
    followup.submit(
        Served(pod_uid=uid, namespace="default", name="p", container="main", device_uuids=(GPUS[0],), staged=True)
    )
    await followup.join()
    worker.cancel()
    assert followup.failures == 0
    assert (await kube.get_pod("default", "p")).metadata.annotations[BIND_PHASE] == BIND_PHASE_SUCCESS
    assert nodes.node_reads == (0 if marked else 1)
