"""MIG mode at Allocate (hami-protocol §2.6, §5.4): the plugin creates the reserved instances, answers with
their UUIDs and nothing of HAMi-core, writes their ids back, and destroys what no live pod owns."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from hami_allocator.allocator import Allocator
from hami_allocator.followup import FollowUp
from hami_allocator.inventory import DeclaredInventory, Gpu
from hami_allocator.mig import MigInstances
from hami_allocator.pending import KubeNodePods, PendingPod
from hami_allocator.server import Endpoint
from hami_allocator.service import AllocatorService, _mig_control
from hami_allocator.settings import AllocatorSettings
from hami_common import envvars
from hami_common.allocation import (
    ContainerGrant,
    GrantedDevice,
    NodeAllocationConfig,
    PodGrant,
    build_container,
    build_pod,
    from_annotation,
    from_placement,
    mig_answer,
)
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_SUCCESS,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    GRANT_SIGNATURE,
    MIG_ALLOCATIONS,
    VGPU_NODE,
    ContainerDevice,
    MigAllocation,
    MigPlacement,
    decode_mig_allocations,
    decode_pod_devices,
)
from hami_common.errors import InvalidInput, NotFound, TransientError
from hami_common.events import AllocationResult, ContainerPlacement, PlacedDevice, PlacementDecision
from hami_common.grants import unverified_reason
from hami_common.inventory import default_state_file, open_mig_control
from hami_common.kube import KubeClient, Pod
from hami_common.resources import GPU
from hami_common.staging import StagedPod, StagingStore, has_host_files
from hami_nodeagent.settings import NodeAgentSettings
from hami_sim.kubelet import KubeletEmulator
from hami_sim.waiting import eventually
from tests.allocator.conftest import GPUS, GRANT_KEY, NODE, SPLIT, bound_pod_body
from tests.allocator.mig_support import FakeMig, annotated_pod, mig_annotations, reservation

MIG_GPU = GPUS[0]
UID = "0f1e2d3c-aaaa-bbbb-cccc-00000000000a"


def dev(uuid: str, mem: int = 4864, cores: int = 14) -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=mem, usedcores=cores)


class ListedPods:
    """:class:`~hami_allocator.pending.NodePods` over pod bodies given by the test."""

    def __init__(self, *bodies: dict[str, Any]) -> None:
        self.pods = [msgspec.convert(b, PendingPod) for b in bodies]

    async def list_node_pods(self, node: str) -> list[PendingPod]:
        return list(self.pods)


def signed(body: dict[str, Any], uid: str) -> dict[str, Any]:
    """The body with its UID and the scheduler's signature over the grant, MIG reservations included."""
    ann = body["metadata"]["annotations"]
    mig = decode_mig_allocations(ann[MIG_ALLOCATIONS]) if MIG_ALLOCATIONS in ann else ()
    ann[GRANT_SIGNATURE] = GRANT_KEY.sign(uid, ann[VGPU_NODE], ann[DEVICES_ALLOCATED], mig)
    body["metadata"]["uid"] = uid
    body.setdefault("status", {})["phase"] = "Pending"
    return body


def mig_pod(name: str, *reservations: MigAllocation, bind_time: int = 10) -> dict[str, Any]:
    devices = {"main": [dev(r.gpu_uuid) for r in reservations]}
    return bound_pod_body(name, devices, bind_time=bind_time, extra_annotations=mig_annotations(*reservations))


def allocator(
    tmp_path: Path,
    fake: FakeMig,
    *,
    pods: ListedPods | KubeNodePods | None = None,
    followup: FollowUp | None = None,
    grace: float = 0.0,
) -> Allocator:
    return Allocator(
        NODE,
        store=StagingStore(tmp_path / "staging"),
        config=NodeAllocationConfig(hook_path=str(tmp_path / "hook")),
        inventory=DeclaredInventory(Gpu(uuid=u) for u in GPUS),
        split=SPLIT,
        followup=followup or FollowUp(NODE),
        pods=pods,
        grant_key=GRANT_KEY,
        mig=MigInstances(fake, node=NODE, grace=grace),
    )


def ids(alloc: Allocator, count: int) -> list[str]:
    return list(alloc.devices())[:count]


def decision(uid: str, *reservations: MigAllocation) -> PlacementDecision:
    return PlacementDecision(
        pod_uid=uid,
        namespace="default",
        name=f"pod-{uid[-4:]}",
        node=NODE,
        bind_time_ns=5,
        containers=(
            ContainerPlacement(
                name="main",
                devices=tuple(
                    PlacedDevice(uuid=r.gpu_uuid, type="NVIDIA", usedmem_mib=4864, usedcores=14) for r in reservations
                ),
                mig=reservations,
            ),
        ),
    )


def stage(alloc: Allocator, placed: PlacementDecision) -> None:
    assert alloc.store.put(
        StagedPod(
            pod_uid=placed.pod_uid,
            namespace=placed.namespace,
            name=placed.name,
            node=NODE,
            bind_time_ns=placed.bind_time_ns,
            containers=build_pod(from_placement(placed), alloc.config),
        )
    )


# --- the answer --------------------------------------------------------------------------------------------


async def test_a_staged_mig_container_gets_its_instances_uuids_and_nothing_of_hami_core(tmp_path: Path) -> None:
    fake = FakeMig((MIG_GPU,))
    alloc = allocator(tmp_path, fake)
    wanted = (reservation(0, 0, MIG_GPU, "1g.5gb", 6, 1), reservation(0, 1, MIG_GPU, "3g.20gb", 0, 4))
    stage(alloc, decision(UID, *wanted))

    answer, served = await alloc.allocate(ids(alloc, 2))

    made = sorted(fake.instances(), key=lambda i: i.placement.start)
    assert [(i.profile, i.placement.start) for i in made] == [("3g.20gb", 0), ("1g.5gb", 6)]
    by_slot = {i.placement.start: i for i in made}
    assert answer.response.envs == {
        envvars.NVIDIA_VISIBLE_DEVICES: f"{by_slot[6].mig_uuid},{by_slot[0].mig_uuid}"  # in device order
    }
    assert answer.response.mounts == ()  # no libvgpu.so, no preload, no cache dir, no limits file
    assert served.staged
    assert [(m.mig_uuid, m.gpu_instance_id, m.compute_instance_id) for m in served.mig] == [
        (by_slot[6].mig_uuid, by_slot[6].gpu_instance_id, 0),
        (by_slot[0].mig_uuid, by_slot[0].gpu_instance_id, 0),
    ]
    assert not (tmp_path / "hook").exists()  # no host files either


class Recorded:
    def __init__(self) -> None:
        self.events: list[msgspec.Struct] = []

    async def publish(self, subject: str, event: msgspec.Struct, *, ctx: object = None) -> None:
        self.events.append(event)


async def test_the_allocation_result_on_the_bus_carries_the_instances(tmp_path: Path) -> None:
    fake = FakeMig((MIG_GPU,))
    published = Recorded()
    followup = FollowUp(NODE, publisher=published)
    alloc = allocator(tmp_path, fake, followup=followup)
    stage(alloc, decision(UID, reservation(0, 0, MIG_GPU, "1g.5gb", 2, 1)))
    worker = asyncio.create_task(followup.run())
    try:
        _, served = await alloc.allocate(ids(alloc, 1))
        alloc.follow_up(served)
        await followup.join()
    finally:
        worker.cancel()
    (result,) = published.events
    assert isinstance(result, AllocationResult)
    (instance,) = fake.instances()
    assert [(m.mig_uuid, m.gpu_instance_id) for m in result.mig] == [(instance.mig_uuid, instance.gpu_instance_id)]


async def test_a_retried_allocate_reuses_the_instance_the_first_try_created(tmp_path: Path) -> None:
    fake = FakeMig((MIG_GPU,))
    alloc = allocator(tmp_path, fake)
    wanted = reservation(0, 0, MIG_GPU, "1g.5gb", 2, 1)
    assert alloc.mig is not None
    (first,) = alloc.mig.realise(UID, (wanted,))  # a first Allocate made it, then its answer was lost
    stage(alloc, decision(UID, wanted))

    answer, _ = await alloc.allocate(ids(alloc, 1))

    assert answer.response.envs[envvars.NVIDIA_VISIBLE_DEVICES] == first.mig_uuid
    assert len(fake.instances()) == 1


async def test_a_refused_instance_is_a_transient_error_and_nothing_is_answered(tmp_path: Path) -> None:
    fake = FakeMig((MIG_GPU,))
    alloc = allocator(tmp_path, fake, grace=3600.0)
    fake.create(MIG_GPU, "3g.20gb", MigPlacement(start=0, size=4))  # unowned, but within its grace
    stage(alloc, decision(UID, reservation(0, 0, MIG_GPU, "1g.5gb", 1, 1)))

    with pytest.raises(TransientError, match="refused a MIG instance"):
        await alloc.allocate(ids(alloc, 1))
    assert alloc.served_staged == 0


async def test_an_instance_left_by_an_ended_pod_in_the_way_is_reclaimed_and_the_allocate_succeeds(
    tmp_path: Path,
) -> None:
    fake = FakeMig((MIG_GPU,))
    alloc = allocator(tmp_path, fake, grace=3600.0)
    left = fake.create(MIG_GPU, "3g.20gb", MigPlacement(start=0, size=4))  # its pod ended while we were away
    done = annotated_pod("u-old", "old", mig_annotations(reservation(0, 0, MIG_GPU, "3g.20gb", 0, 4)), phase="Failed")
    alloc.known_pods = lambda: watched(done)
    alloc.known_pods_synced = lambda: True
    stage(alloc, decision(UID, reservation(0, 0, MIG_GPU, "1g.5gb", 1, 1)))

    answer, _ = await alloc.allocate(ids(alloc, 1))

    (instance,) = fake.instances()
    assert instance != left
    assert answer.response.envs == {envvars.NVIDIA_VISIBLE_DEVICES: instance.mig_uuid}


def test_mig_answer_names_cdi_devices_and_refuses_instances_of_other_reservations() -> None:
    wanted = reservation(0, 0, MIG_GPU, "1g.5gb", 6, 1)
    pending = build_container(
        UID,
        ContainerGrant(name="main", devices=(GrantedDevice(MIG_GPU, 4864, 14),), mig=(wanted,)),
        NodeAllocationConfig(),
    )
    assert pending.pending_mig
    assert pending.response.envs == {}
    done = msgspec.structs.replace(wanted, mig_uuid="MIG-1", gpu_instance_id=9, compute_instance_id=0)
    answer = mig_answer(pending, (done,), NodeAllocationConfig(cdi_kind="nvidia.com/gpu"))
    assert answer.response.cdi_devices == ("nvidia.com/gpu=MIG-1",)
    assert not answer.pending_mig
    elsewhere = msgspec.structs.replace(done, placement=MigPlacement(start=5, size=1))
    with pytest.raises(InvalidInput, match="do not match"):
        mig_answer(pending, (elsewhere,), NodeAllocationConfig())


def test_reservations_pair_with_the_container_at_their_index_and_must_match_its_devices() -> None:
    devices = decode_pod_devices(f"GPU-x,NVIDIA,100,0:;{MIG_GPU},NVIDIA,4864,14:;")
    mine = reservation(1, 0, MIG_GPU, "1g.5gb", 3, 1)
    grant = from_annotation(
        pod_uid=UID, namespace="d", name="p", container_names=["a", "b"], devices=devices, mig=[mine]
    )
    assert (grant.containers[0].mig, grant.containers[1].mig) == ((), (mine,))
    with pytest.raises(InvalidInput, match="is on GPU-other"):
        from_annotation(
            pod_uid=UID, namespace="d", name="p", container_names=["a", "b"], devices=devices,
            mig=[reservation(1, 0, "GPU-other", "1g.5gb", 3, 1)],
        )  # fmt: skip
    with pytest.raises(InvalidInput, match="containers \\[2\\]"):
        from_annotation(
            pod_uid=UID, namespace="d", name="p", container_names=["a", "b"], devices=devices,
            mig=[reservation(2, 0, MIG_GPU, "1g.5gb", 3, 1)],
        )  # fmt: skip


def test_a_staged_mig_entry_has_no_host_files_to_write(tmp_path: Path) -> None:
    grant = PodGrant(
        pod_uid=UID,
        namespace="default",
        name="p",
        containers=(
            ContainerGrant(
                name="main",
                devices=(GrantedDevice(MIG_GPU, 4864, 14),),
                mig=(reservation(0, 0, MIG_GPU, "1g.5gb", 0, 1),),
            ),
        ),
    )
    config = NodeAllocationConfig(hook_path=str(tmp_path / "hook"))
    (entry,) = build_pod(grant, config)
    store = StagingStore(tmp_path / "staging")
    assert store.put(
        StagedPod(pod_uid=UID, namespace="default", name="p", node=NODE, bind_time_ns=1, containers=(entry,))
    )
    assert has_host_files(entry)
    assert not (tmp_path / "hook").exists()
    staged = store.get(UID)
    assert staged is not None
    assert staged.containers[0].mig == entry.mig


# --- the fallback, the grant, the patch back ----------------------------------------------------------------


async def test_the_fallback_creates_the_instance_and_writes_its_ids_back(
    tmp_path: Path, kube: KubeClient, core: Any
) -> None:
    fake = FakeMig((MIG_GPU,))
    body = mig_pod("train", reservation(0, 0, MIG_GPU, "1g.5gb", 4, 1))
    created = await asyncio.to_thread(core.create_namespaced_pod, "default", body)
    uid = str(created.metadata.uid)
    ann = body["metadata"]["annotations"]
    signature = GRANT_KEY.sign(uid, NODE, ann[DEVICES_ALLOCATED], decode_mig_allocations(ann[MIG_ALLOCATIONS]))
    patch = {"metadata": {"annotations": {GRANT_SIGNATURE: signature}}}
    await asyncio.to_thread(core.patch_namespaced_pod, "train", "default", patch)
    followup = FollowUp(NODE, pods=kube)
    alloc = allocator(tmp_path, fake, pods=KubeNodePods(kube), followup=followup)
    worker = asyncio.create_task(followup.run())
    try:
        answer, served = await alloc.allocate(ids(alloc, 1))
        alloc.follow_up(served)
        await followup.join()
    finally:
        worker.cancel()

    (instance,) = fake.instances()
    assert answer.response.envs == {envvars.NVIDIA_VISIBLE_DEVICES: instance.mig_uuid}
    assert not served.staged
    pod = await kube.get_pod("default", "train")
    (entry,) = decode_mig_allocations(pod.metadata.annotations[MIG_ALLOCATIONS])
    assert (entry.mig_uuid, entry.gpu_instance_id, entry.compute_instance_id) == (
        instance.mig_uuid,
        instance.gpu_instance_id,
        instance.compute_instance_id,
    )
    assert (entry.profile, entry.placement) == ("1g.5gb", MigPlacement(start=4, size=1))
    assert pod.metadata.annotations[BIND_PHASE] == BIND_PHASE_SUCCESS
    assert not any(decode_pod_devices(pod.metadata.annotations[DEVICES_TO_ALLOCATE]))
    # the patched annotation still carries a valid grant: the signature covers the scheduler's part only
    assert unverified_reason(GRANT_KEY, uid, pod.metadata.annotations) == ""


async def test_an_init_container_then_the_app_container_each_get_their_own_instance(
    tmp_path: Path, kube: KubeClient, core: Any
) -> None:
    """The init container's entry is erased once it is served; its reservation stays in the annotation (the
    instance lives until the pod ends), and the app container's Allocate must still pair its own."""
    fake = FakeMig((MIG_GPU,))
    first, second = reservation(0, 0, MIG_GPU, "1g.5gb", 4, 1), reservation(1, 0, MIG_GPU, "1g.5gb", 5, 1)
    body = bound_pod_body(
        "warmed", {"warm-up": [dev(MIG_GPU)], "main": [dev(MIG_GPU)]}, bind_time=10,
        extra_annotations=mig_annotations(first, second),
    )  # fmt: skip
    body["spec"]["initContainers"] = body["spec"]["containers"][:1]
    body["spec"]["containers"] = body["spec"]["containers"][1:]
    created = await asyncio.to_thread(core.create_namespaced_pod, "default", body)
    ann = body["metadata"]["annotations"]
    signature = GRANT_KEY.sign(
        str(created.metadata.uid), NODE, ann[DEVICES_ALLOCATED], decode_mig_allocations(ann[MIG_ALLOCATIONS])
    )
    await asyncio.to_thread(
        core.patch_namespaced_pod, "warmed", "default", {"metadata": {"annotations": {GRANT_SIGNATURE: signature}}}
    )
    followup = FollowUp(NODE, pods=kube)
    alloc = allocator(tmp_path, fake, pods=KubeNodePods(kube), followup=followup)
    worker = asyncio.create_task(followup.run())
    answers = []
    try:
        for _ in range(2):  # the kubelet allocates the init container, then the app container
            answer, served = await alloc.allocate(ids(alloc, 1))
            alloc.follow_up(served)
            await followup.join()
            answers.append(answer.response.envs[envvars.NVIDIA_VISIBLE_DEVICES])
    finally:
        worker.cancel()

    by_slot = {i.placement.start: i.mig_uuid for i in fake.instances()}
    assert answers == [by_slot[4], by_slot[5]]  # each container its own instance, init first
    pod = await kube.get_pod("default", "warmed")
    assert pod.metadata.annotations[BIND_PHASE] == BIND_PHASE_SUCCESS


@pytest.mark.parametrize(
    "tampered",
    [
        pytest.param(reservation(0, 0, MIG_GPU, "7g.40gb", 0, 8), id="a larger profile"),
        pytest.param(reservation(0, 0, MIG_GPU, "1g.5gb", 5, 1), id="another placement"),
    ],
)
async def test_a_reservation_changed_after_the_scheduler_signed_it_is_refused(
    tmp_path: Path, tampered: MigAllocation
) -> None:
    body = signed(mig_pod("greedy", reservation(0, 0, MIG_GPU, "1g.5gb", 6, 1)), UID)
    body["metadata"]["annotations"].update(mig_annotations(tampered))  # the tenant's edit
    fake = FakeMig((MIG_GPU,))
    alloc = allocator(tmp_path, fake, pods=ListedPods(body))

    with pytest.raises(NotFound, match="signature does not match"):
        await alloc.allocate(ids(alloc, 1))
    assert fake.instances() == ()


async def test_a_staged_entry_without_reservations_takes_them_from_the_signed_annotation(tmp_path: Path) -> None:
    """A placement from a scheduler that did not send the reservations: the node agent staged a HAMi-core
    answer for a GPU in MIG mode. The plugin answers with the instance the pod's annotation reserves."""
    fake = FakeMig((MIG_GPU,))
    alloc = allocator(tmp_path, fake)
    wanted = reservation(0, 0, MIG_GPU, "1g.5gb", 3, 1)
    pod = msgspec.convert(signed(mig_pod("old-sched", wanted), UID), Pod)
    alloc.known_pods = lambda: (pod,)
    plain = msgspec.structs.replace(decision(UID, wanted), name="old-sched")
    plain = msgspec.structs.replace(plain, containers=(msgspec.structs.replace(plain.containers[0], mig=()),))
    stage(alloc, plain)

    answer, served = await alloc.allocate(ids(alloc, 1))

    (instance,) = fake.instances()
    assert instance.placement == wanted.placement
    assert answer.response.envs == {envvars.NVIDIA_VISIBLE_DEVICES: instance.mig_uuid}
    assert served.mig[0].mig_uuid == instance.mig_uuid


# --- destroy and reclaim ------------------------------------------------------------------------------------


def watched(*bodies: dict[str, Any]) -> list[Pod]:
    return [msgspec.convert(b, Pod) for b in bodies]


def test_reclaim_keeps_owned_instances_and_destroys_those_of_ended_pods_at_once() -> None:
    fake = FakeMig((MIG_GPU,))
    owned = fake.create(MIG_GPU, "1g.5gb", MigPlacement(start=0, size=1))
    finished = fake.create(MIG_GPU, "1g.5gb", MigPlacement(start=1, size=1))
    now = [0.0]
    mig = MigInstances(fake, grace=60.0, clock=lambda: now[0])  # a restarted allocator: it created none of them
    pods = watched(
        annotated_pod("u-run", "runs", mig_annotations(reservation(0, 0, MIG_GPU, "1g.5gb", 0, 1))),
        annotated_pod("u-done", "done", mig_annotations(reservation(0, 0, MIG_GPU, "1g.5gb", 1, 1)), phase="Succeeded"),
    )

    reclaimed = mig.reclaim(pods, gone=())

    assert [r.instance for r in reclaimed] == [finished]
    assert "default/done ended" in reclaimed[0].reason
    now[0] += 3600  # however long it lives, a running pod's instance stays
    assert mig.reclaim(pods, gone=()) == []
    assert fake.instances() == (owned,)


def test_an_instance_nobody_owns_goes_after_the_grace_not_before() -> None:
    fake = FakeMig((MIG_GPU,))
    orphan = fake.create(MIG_GPU, "3g.20gb", MigPlacement(start=4, size=4))
    now = [100.0]
    mig = MigInstances(fake, grace=60.0, clock=lambda: now[0])

    assert mig.reclaim([], gone=()) == []
    now[0] += 59
    assert mig.reclaim([], gone=()) == []
    now[0] += 1
    (reclaimed,) = mig.reclaim([], gone=())
    assert reclaimed.instance == orphan
    assert "no live pod owns it" in reclaimed.reason
    assert fake.instances() == ()


def test_an_instance_created_here_survives_until_its_pod_is_known_and_goes_when_it_ends() -> None:
    fake = FakeMig((MIG_GPU,))
    mig = MigInstances(fake, grace=60.0, clock=lambda: 0.0)
    wanted = reservation(0, 0, MIG_GPU, "1g.5gb", 5, 1)
    mig.realise("u-new", (wanted,))

    assert mig.reclaim([], gone=()) == []  # the watch does not show the pod yet
    running = watched(annotated_pod("u-new", "new", mig_annotations(wanted)))
    assert mig.reclaim(running, gone=()) == []
    (reclaimed,) = mig.reclaim(running, gone={"u-new"})  # deleted
    assert reclaimed.instance.placement == wanted.placement
    assert fake.instances() == ()


async def test_the_service_reclaims_orphans_at_start_and_destroys_instances_when_their_pod_ends(
    tmp_path: Path, sockdir: Path, kubelet: KubeletEmulator, kube: KubeClient, core: Any
) -> None:
    fake = FakeMig((MIG_GPU,))
    left_over = fake.create(MIG_GPU, "1g.5gb", MigPlacement(start=0, size=1))  # its pod ended while we were down
    wanted = reservation(0, 0, MIG_GPU, "3g.20gb", 4, 4)
    body = mig_pod("job", wanted)
    created = await asyncio.to_thread(core.create_namespaced_pod, "default", body)
    uid = str(created.metadata.uid)
    ann = body["metadata"]["annotations"]
    signature = GRANT_KEY.sign(uid, NODE, ann[DEVICES_ALLOCATED], (wanted,))
    await asyncio.to_thread(
        core.patch_namespaced_pod, "job", "default", {"metadata": {"annotations": {GRANT_SIGNATURE: signature}}}
    )
    service = AllocatorService(
        node=NODE,
        endpoint=Endpoint(
            plugin_dir=sockdir, socket_name="vgpu.sock", resource_name=GPU, preferred_available=True,
            register_timeout=5.0, watch_interval=0.02,
        ),
        inventory=DeclaredInventory(Gpu(uuid=u) for u in GPUS),
        store=StagingStore(tmp_path / "staging"),
        config=NodeAllocationConfig(hook_path=str(tmp_path / "hook")),
        split=SPLIT,
        kube=kube,
        grant_key=GRANT_KEY,
        mig=fake,
        mig_grace=0.0,
    )  # fmt: skip
    task = asyncio.create_task(service.run())
    try:
        await eventually(lambda: left_over not in fake.instances(), what="the left-over instance reclaimed")
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        admitting = asyncio.create_task(kubelet.run_pods(kube))
        admission = await kubelet.wait_admitted(uid)
        await service.followup.join()
        assert admission.ok, admission
        (instance,) = fake.instances()
        assert admission.container("main").envs[envvars.NVIDIA_VISIBLE_DEVICES] == instance.mig_uuid

        def written_back() -> bool:
            pod = service.pods.get("default", "job") if service.pods is not None else None
            return pod is not None and decode_mig_allocations(pod.metadata.annotations[MIG_ALLOCATIONS])[0].realised

        await eventually(written_back, what="the watch shows the ids written back")
        assert await service.allocator.reclaim_mig() == []  # owned by a running pod: a pass keeps it
        assert fake.instances() == (instance,)

        await asyncio.to_thread(core.delete_namespaced_pod, "job", "default", grace_period_seconds=0)
        await eventually(lambda: fake.instances() == (), what="the instance destroyed once its pod is deleted")
        admitting.cancel()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --- the node's config ---------------------------------------------------------------------------------------


async def test_operatingmode_mig_opens_the_driver_the_node_agent_sees(tmp_path: Path) -> None:
    """The node agent and the allocator are separate processes: with the fake inventory they share the
    instances through one state file, as they share a real driver; with declared GPUs MIG mode is refused."""
    inventory = tmp_path / "inventory.yaml"
    gpu = {"uuid": MIG_GPU, "model": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "mig": True}
    inventory.write_text(yaml.safe_dump({"nodes": {NODE: [gpu]}}))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"nodeconfig": [{"name": NODE, "operatingmode": "mig", "migstrategy": "mixed"}]}))
    settings = AllocatorSettings(
        node_name=NODE, inventory="fake", fake_inventory=str(inventory), node_config_file=str(config)
    )
    node = settings.node_config()
    agent = NodeAgentSettings(node_name=NODE, inventory="fake", node_config_file=str(config)).node_config()
    assert node.mode == agent.mode == "mig"
    async with contextlib.AsyncExitStack() as stack:
        control = await _mig_control(settings, node, stack)
        assert control is not None
        made = control.create(MIG_GPU, "1g.5gb", MigPlacement(start=3, size=1))
        seen_by_agent = open_mig_control("fake", node=NODE, fake_file=str(inventory))
        assert seen_by_agent.instances() == (made,)
        control.destroy(MIG_GPU, made.gpu_instance_id)
        declared = AllocatorSettings(node_name=NODE, gpus=(MIG_GPU,), node_config_file=str(config))
        with pytest.raises(InvalidInput, match="operatingmode mig needs GPU discovery"):
            await _mig_control(declared, declared.node_config(), stack)
    state = default_state_file(inventory, NODE)
    for leftover in (state, state.with_name(state.name + ".lock")):
        leftover.unlink(missing_ok=True)
