"""The device plugin over real unix sockets, against the kubelet emulator: registration, restarts,
ListAndWatch, the staged path, and what malformed requests get."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_allocator.inventory import MAX_DEVICE_ID, DeclaredInventory
from hami_common import envvars, subjects
from hami_common.allocation import NodeAllocationConfig
from hami_common.bus import Bus, Delivery
from hami_common.deviceplugin.rpc import HEALTHY, DevicePluginClient, pb, unix_target
from hami_common.events import AllocationResult
from hami_common.resources import GPU
from hami_common.staging import StagingStore, entry_name
from hami_sim.kubelet import KubeletEmulator
from tests.allocator.conftest import GPUS, NODE, SPLIT, grant_of, pod_object, running_allocator, stage

UID_A = "aaaaaaaa-0000-0000-0000-000000000001"
UID_B = "bbbbbbbb-0000-0000-0000-000000000002"


async def test_plugin_registers_and_advertises_split_devices_per_gpu(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
) -> None:
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory):
        await kubelet.wait_registered()
        view = await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
    assert view.endpoint == "vgpu.sock"
    assert view.options.get_preferred_allocation_available
    assert sorted(view.devices) == sorted(f"{u}-{i}" for u in GPUS for i in range(SPLIT))
    assert all(len(i) <= MAX_DEVICE_ID for i in view.devices)


async def test_kubelet_restart_leads_to_registration_again(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
) -> None:
    stage(store, grant_of(UID_A, ("main", ((GPUS[0], 1000, 10),))), alloc_config, 1)
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory) as svc:
        await kubelet.wait_registered()
        await kubelet.restart()  # deletes every socket, the plugin's too, and serves kubelet.sock again
        await kubelet.wait_registered(2)
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        admission = await kubelet.admit(pod_object(UID_A, "a", {"main": 1}))
    assert kubelet.starts == 2
    assert svc.server.registrations == 2
    assert admission.ok, admission
    assert admission.container("main").envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[0]


async def test_health_change_resends_the_full_list(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
) -> None:
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory):
        view = await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        await inventory.set_health(GPUS[1], False)
        await kubelet.wait_devices(GPU, SPLIT)
        devices = dict(view.devices)
    assert len(devices) == len(GPUS) * SPLIT  # capacity unchanged, allocatable down
    assert {i for i, h in devices.items() if h != HEALTHY} == {f"{GPUS[1]}-{i}" for i in range(SPLIT)}


async def test_staged_answer_is_served_with_hamis_environment_and_mounts(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
) -> None:
    grant = grant_of(UID_A, ("init", ()), ("train", ((GPUS[0], 3000, 50), (GPUS[1], 2000, 50))))
    staged = stage(store, grant, alloc_config, 1)
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory) as svc:
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        admission = await kubelet.admit(pod_object(UID_A, "a", {"train": 2}))
    answer = admission.container("train")
    assert answer.envs == staged.containers[0].response.envs
    assert answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert answer.envs[envvars.CUDA_DEVICE_SM_LIMIT] == "50"
    assert answer.envs[envvars.NVIDIA_VISIBLE_DEVICES] == ",".join(GPUS)
    assert answer.response is not None
    mounts = {m.container_path: (m.host_path, m.read_only) for m in answer.response.mounts}
    assert mounts["/etc/vgpu/limits"] == (staged.containers[0].limits_host_path, True)
    limits_file = await asyncio.to_thread(Path(staged.containers[0].limits_host_path).read_text)
    assert limits_file == staged.containers[0].limits_content
    assert await asyncio.to_thread(Path(staged.containers[0].cache_dir).is_dir)
    assert svc.allocator.served_staged == 1
    # the kubelet was steered to virtual devices of the granted GPUs
    assert {i.rsplit("-", 1)[0] for i in answer.device_ids} == set(GPUS)


async def test_two_staged_pods_back_to_back_each_get_their_own_devices(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
) -> None:
    stage(store, grant_of(UID_A, ("main", ((GPUS[0], 1000, 10),))), alloc_config, 100)
    stage(store, grant_of(UID_B, ("main", ((GPUS[1], 2000, 20),))), alloc_config, 200)
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory):
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        first = await kubelet.admit(pod_object(UID_A, "a", {"main": 1}))
        second = await kubelet.admit(pod_object(UID_B, "b", {"main": 1}))
    assert first.container("main").envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[0]
    assert second.container("main").envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[1]
    assert second.container("main").envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"


async def test_allocation_result_is_published_on_the_nodes_subject(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    bus: Bus,
) -> None:
    results: asyncio.Queue[AllocationResult] = asyncio.Queue()

    async def on_result(event: AllocationResult, delivery: Delivery) -> None:
        await results.put(event)

    await bus.subscribe(subjects.allocated(NODE), AllocationResult, on_result)
    stage(store, grant_of(UID_A, ("main", ((GPUS[0], 1000, 10),))), alloc_config, 1)
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory, publisher=bus):
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        await kubelet.admit(pod_object(UID_A, "a", {"main": 1}))
        async with asyncio.timeout(10):
            result = await results.get()
    assert (result.pod_uid, result.container, result.ok, result.staged) == (UID_A, "main", True, True)
    assert result.device_uuids == (GPUS[0],)
    assert result.allocate_ns is not None
    assert result.allocate_ns > 0


# --- malformed and unknown requests -----------------------------------------------------------------------


async def _allocate(sockdir: Path, request: pb.AllocateRequest) -> pb.AllocateResponse:
    async with grpc.aio.insecure_channel(unix_target(str(sockdir / "vgpu.sock"))) as channel:
        return await DevicePluginClient(channel).allocate(request, deadline=5.0)


def _request(*ids: str) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=list(ids))])


@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        pytest.param(
            pb.AllocateRequest(),
            grpc.StatusCode.INVALID_ARGUMENT,
            "no container requests",
            id="zero containers is an invalid argument",
        ),
        pytest.param(
            _request("GPU-nope-0"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "unknown device IDs",
            id="unknown device IDs are an invalid argument",
        ),
        pytest.param(
            _request(),
            grpc.StatusCode.INVALID_ARGUMENT,
            "names no device IDs",
            id="a container without device IDs is an invalid argument",
        ),
        pytest.param(
            _request(f"{GPUS[0]}-0", f"{GPUS[0]}-0"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "repeated",
            id="repeated device IDs are an invalid argument",
        ),
        pytest.param(
            _request(f"{GPUS[0]}-0"),
            grpc.StatusCode.NOT_FOUND,
            "nothing staged",
            id="nothing staged and no apiserver is not found",
        ),
    ],
)
async def test_malformed_requests_get_a_clear_error_and_the_plugin_keeps_serving(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    request_: pb.AllocateRequest,
    code: grpc.StatusCode,
    words: str,
) -> None:
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory):
        await kubelet.wait_registered()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _allocate(sockdir, request_)
        stage(store, grant_of(UID_A, ("main", ((GPUS[0], 1000, 10),))), alloc_config, 1)
        answer = await _allocate(sockdir, _request(f"{GPUS[0]}-1"))
    assert caught.value.code() == code
    assert words in (caught.value.details() or "")
    assert answer.container_responses[0].envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[0]


async def test_corrupt_staged_entry_is_reported_set_aside_and_the_next_pod_served(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
) -> None:
    store.root.mkdir(parents=True)
    (store.root / entry_name(1, UID_B)).write_bytes(b'{"schema": 1, "pod_uid": ')
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory):
        await kubelet.wait_registered()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _allocate(sockdir, _request(f"{GPUS[0]}-0"))
        stage(store, grant_of(UID_A, ("main", ((GPUS[0], 1000, 10),))), alloc_config, 2)
        answer = await _allocate(sockdir, _request(f"{GPUS[0]}-0"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert f"staged entry {entry_name(1, UID_B)} is corrupt" in (caught.value.details() or "")
    assert answer.container_responses[0].envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[0]


async def test_arbitrary_allocate_requests_get_grpc_errors_never_a_dead_plugin(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
) -> None:
    codes: set[grpc.StatusCode] = set()
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory):
        await kubelet.wait_registered()
        async with grpc.aio.insecure_channel(unix_target(str(sockdir / "vgpu.sock"))) as channel:
            plugin = DevicePluginClient(channel)

            @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
            @given(st.lists(st.lists(st.text(max_size=70), max_size=4), max_size=3))
            def probe(containers: list[list[str]]) -> None:
                request = pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]
                )
                future = asyncio.run_coroutine_threadsafe(plugin.allocate(request, deadline=5.0), loop)
                try:
                    future.result(10)
                except grpc.aio.AioRpcError as err:
                    codes.add(err.code())

            loop = asyncio.get_running_loop()
            await asyncio.to_thread(probe)
            options = await plugin.options(deadline=5.0)
    assert codes <= {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}
    assert options.get_preferred_allocation_available


async def test_preferred_allocation_steers_the_kubelet_to_the_staged_gpu(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
) -> None:
    stage(store, grant_of(UID_A, ("main", ((GPUS[1], 1000, 10),))), alloc_config, 1)
    available = [f"{GPUS[0]}-0", f"{GPUS[0]}-1", f"{GPUS[1]}-0"]
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory):
        await kubelet.wait_registered()
        async with grpc.aio.insecure_channel(unix_target(str(sockdir / "vgpu.sock"))) as channel:
            reply = await DevicePluginClient(channel).preferred(
                pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=1)
                    ]
                ),
                deadline=5.0,
            )
            pre = await DevicePluginClient(channel).pre_start(pb.PreStartContainerRequest(), deadline=5.0)
    assert list(reply.container_responses[0].deviceIDs) == [f"{GPUS[1]}-0"]
    assert pre == pb.PreStartContainerResponse()


async def test_negative_preferred_allocation_size_is_an_invalid_argument(
    sockdir: Path,
    kubelet: KubeletEmulator,
    store: StagingStore,
    alloc_config: NodeAllocationConfig,
    inventory: DeclaredInventory,
) -> None:
    request = pb.PreferredAllocationRequest(
        container_requests=[pb.ContainerPreferredAllocationRequest(available_deviceIDs=["x"], allocation_size=-1)]
    )
    async with running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory):
        await kubelet.wait_registered()
        async with grpc.aio.insecure_channel(unix_target(str(sockdir / "vgpu.sock"))) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await DevicePluginClient(channel).preferred(request, deadline=5.0)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
