"""MIG cards in the extender: the ledger tracks instances and placements from ``hami.io/vgpu-mig-allocations``
(booked, released, rebuilt after a restart), and Filter/Bind write and publish the reservations."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from pathlib import Path

from hami_common import subjects
from hami_common.annotations import (
    DEVICES_ALLOCATED,
    MIG_ALLOCATIONS,
    NODE_REGISTER,
    VGPU_NODE,
    ContainerDevice,
    DeviceInfo,
    MigAllocation,
    decode_mig_allocations,
    decode_pod_devices,
    encode_mig_allocations,
    encode_node_devices,
    encode_pod_devices,
)
from hami_common.annotations.registration import MigPlacement, MigProfile
from hami_common.bus import Bus, Delivery
from hami_common.deviceconfig import MigAllowlist
from hami_common.events import PlacementDecision
from hami_common.grants import GrantKey, unverified_reason
from hami_common.kube import (
    Change,
    Container,
    ContainerState,
    ContainerStateTerminated,
    ContainerStatus,
    Node,
    ObjectMeta,
    Pod,
    PodSpec,
    PodStatus,
)
from hami_extender.ledger import Ledger
from hami_extender.settings import ExtenderSettings
from hami_extender.sync import LedgerSync, booking_from
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.waiting import eventually
from tests.extender.cluster import PODS, add_node, add_pod, cards, gpu_container, pod_annotations
from tests.extender.conftest import Served, serve


def _profile(name: str, memory: int, core: int, slices: int, starts: tuple[int, ...], size: int) -> MigProfile:
    return MigProfile(
        name=name,
        memory_mb=memory,
        core=core,
        slice_count=slices,
        placements=tuple(MigPlacement(start=s, size=size) for s in starts),
    )


A100_40GB = (
    _profile("1g.5gb", 4864, 14, 1, tuple(range(7)), 1),
    _profile("2g.10gb", 9856, 28, 2, (0, 2, 4), 2),
    _profile("3g.20gb", 19968, 42, 3, (0, 4), 4),
    _profile("4g.20gb", 19968, 57, 4, (0,), 4),
    _profile("7g.40gb", 40192, 100, 7, (0,), 8),
)
MODEL = "NVIDIA A100-SXM4-40GB"


def mig_cards(node: str, n: int = 1) -> list[DeviceInfo]:
    return [
        DeviceInfo(
            id=f"MIGGPU-{node}-{i}",
            index=i,
            count=7,
            devmem=40960,
            devcore=100,
            type=MODEL,
            mode="mig",
            mig_profiles=A100_40GB,
            health=True,
        )
        for i in range(n)
    ]


def mig_node(name: str, n: int = 1) -> Node:
    return Node(metadata=ObjectMeta(name=name, annotations={NODE_REGISTER: encode_node_devices(mig_cards(name, n))}))


def reservation(gpu: str, profile: str, start: int, size: int, container: int = 0, device: int = 0) -> MigAllocation:
    return MigAllocation(
        container_index=container,
        device_index=device,
        gpu_uuid=gpu,
        profile=profile,
        placement=MigPlacement(start=start, size=size),
    )


def mig_pod(
    name: str, node: str, *instances: MigAllocation, phase: str = "Running", mem: int = 9856, mig_text: str = ""
) -> Pod:
    """A pod as the extender leaves it: one container holding ``instances`` (each a card of ``mem`` MiB)."""
    grants = [[ContainerDevice(uuid=i.gpu_uuid, type="NVIDIA", usedmem=mem, usedcores=28) for i in instances]]
    annotations = {
        VGPU_NODE: node,
        DEVICES_ALLOCATED: encode_pod_devices(grants),
        MIG_ALLOCATIONS: mig_text or encode_mig_allocations(instances),
    }
    return Pod(
        metadata=ObjectMeta(name=name, namespace="ns", uid=f"uid-{name}", annotations=annotations),
        spec=PodSpec(containers=(Container(name="c0"),)),
        status=PodStatus(phase=phase),
    )


def placements_on(ledger: Ledger, node: str, gpu: str) -> list[int]:
    view = ledger.view(node)
    assert view is not None
    card = next(d for d in view.usage.devices if d.id == gpu)
    return sorted(i.placement.start for i in card.mig_instances)


GPU = "MIGGPU-n1-0"


# --- the ledger, as plain values -------------------------------------------------------------------------


def test_a_pods_reservations_book_their_placements_and_its_deletion_frees_them() -> None:
    ledger = Ledger()
    sync = LedgerSync(ledger)
    sync.on_node(Change("ADDED", mig_node("n1")))
    pod = mig_pod("p", "n1", reservation(GPU, "2g.10gb", 4, 2))
    sync.on_pod(Change("ADDED", pod))
    assert placements_on(ledger, "n1", GPU) == [4]
    view = ledger.view("n1")
    assert view is not None
    assert (view.usage.devices[0].used, view.usage.devices[0].usedmem) == (1, 9856)
    sync.on_pod(Change("DELETED", pod))
    assert placements_on(ledger, "n1", GPU) == []
    assert ledger.booking("uid-p") is None


def test_a_finished_pod_frees_its_placements() -> None:
    ledger = Ledger()
    sync = LedgerSync(ledger)
    sync.on_node(Change("ADDED", mig_node("n1")))
    sync.on_pod(Change("ADDED", mig_pod("p", "n1", reservation(GPU, "1g.5gb", 6, 1))))
    assert placements_on(ledger, "n1", GPU) == [6]
    sync.on_pod(Change("MODIFIED", mig_pod("p", "n1", reservation(GPU, "1g.5gb", 6, 1), phase="Succeeded")))
    assert placements_on(ledger, "n1", GPU) == []


def test_runtime_ids_written_back_by_the_device_plugin_change_nothing_booked() -> None:
    ledger = Ledger()
    sync = LedgerSync(ledger)
    sync.on_node(Change("ADDED", mig_node("n1")))
    planned = reservation(GPU, "2g.10gb", 4, 2)
    sync.on_pod(Change("ADDED", mig_pod("p", "n1", planned)))
    before = ledger.state()
    done = MigAllocation(
        container_index=0,
        device_index=0,
        gpu_uuid=GPU,
        profile="2g.10gb",
        placement=MigPlacement(start=4, size=2),
        mig_uuid="MIG-1",
        gpu_instance_id=3,
        compute_instance_id=0,
    )
    sync.on_pod(Change("MODIFIED", mig_pod("p", "n1", done)))
    assert ledger.state().nodes == before.nodes


def test_a_ledger_rebuilt_from_the_annotations_after_a_restart_is_the_one_kept_incrementally() -> None:
    pods = [
        mig_pod("a", "n1", reservation(GPU, "1g.5gb", 6, 1), mem=4864),
        mig_pod("b", "n1", reservation(GPU, "2g.10gb", 2, 2), reservation(GPU, "1g.5gb", 5, 1, device=1)),
        mig_pod("c", "n1", reservation("MIGGPU-n1-1", "3g.20gb", 0, 4), mem=19968),
        mig_pod("d", "n1", reservation(GPU, "1g.5gb", 0, 1), mem=4864),
    ]
    kept = Ledger()
    live = LedgerSync(kept)
    live.on_node(Change("ADDED", mig_node("n1", n=2)))
    for p in reversed(pods):  # the order the pods came in differs from the rebuilt ledger's (by UID)
        live.on_pod(Change("ADDED", p))
    live.on_pod(Change("DELETED", pods[3]))
    restarted = Ledger()
    fresh = LedgerSync(restarted)
    for p in pods[:3]:  # after a restart the watch lists what is left, pods first here
        fresh.on_pod(Change("ADDED", p))
    fresh.on_node(Change("ADDED", mig_node("n1", n=2)))
    assert restarted.state() == kept.state()
    assert placements_on(restarted, "n1", GPU) == [2, 5, 6]
    assert placements_on(restarted, "n1", "MIGGPU-n1-1") == [0]


def test_an_unreadable_reservation_is_counted_and_books_nothing() -> None:
    ledger = Ledger()
    sync = LedgerSync(ledger)
    sync.on_node(Change("ADDED", mig_node("n1")))
    bad = '[{"containerIndex":0,"migUUID":"MIG-1"}]'
    pod = mig_pod("p", "n1", reservation(GPU, "1g.5gb", 6, 1), mig_text=bad)
    sync.on_pod(Change("ADDED", pod))
    assert sync.malformed == 1
    assert ledger.booking("uid-p") is None
    assert placements_on(ledger, "n1", GPU) == []


def test_a_finished_init_containers_instance_stays_booked_until_the_pod_ends() -> None:
    # init container 0 had a 1g instance at 6 and exited; app container 1 runs with a 2g instance at 4
    init_gpu = ContainerDevice(uuid=GPU, type="NVIDIA", usedmem=4864, usedcores=14)
    app_gpu = ContainerDevice(uuid=GPU, type="NVIDIA", usedmem=9856, usedcores=28)
    instances = (reservation(GPU, "1g.5gb", 6, 1), reservation(GPU, "2g.10gb", 4, 2, container=1))
    done = ContainerStatus(name="i0", state=ContainerState(terminated=ContainerStateTerminated(exit_code=0)))
    pod = Pod(
        metadata=ObjectMeta(
            name="p",
            namespace="ns",
            uid="uid-p",
            annotations={
                VGPU_NODE: "n1",
                DEVICES_ALLOCATED: encode_pod_devices([[init_gpu], [app_gpu]]),
                MIG_ALLOCATIONS: encode_mig_allocations(instances),
            },
        ),
        spec=PodSpec(init_containers=(Container(name="i0"),), containers=(Container(name="c0"),)),
        status=PodStatus(phase="Running", init_container_statuses=(done,)),
    )
    booked = booking_from(pod)
    assert booked is not None
    [charge] = booked.charges
    assert (charge.usedmem, charge.usedcores, charge.slots) == (9856, 28, 1)  # the init container's memory is back
    assert sorted(i.placement.start for i in charge.instances) == [4, 6]  # its instance is not
    ledger = Ledger()
    sync = LedgerSync(ledger)
    sync.on_node(Change("ADDED", mig_node("n1")))
    sync.on_pod(Change("ADDED", pod))
    assert placements_on(ledger, "n1", GPU) == [4, 6]


def test_the_pre_filter_lets_a_mig_node_take_more_instances_than_it_has_cards() -> None:
    ledger = Ledger()
    LedgerSync(ledger).on_node(Change("ADDED", mig_node("n1")))
    view = ledger.view("n1")
    assert view is not None
    assert view.may_fit(3, 4000, 0)
    plain = Ledger()
    LedgerSync(plain).on_node(
        Change(
            "ADDED",
            Node(metadata=ObjectMeta(name="n2", annotations={NODE_REGISTER: encode_node_devices(cards("n2", n=1))})),
        )
    )
    plain_view = plain.view("n2")
    assert plain_view is not None
    assert not plain_view.may_fit(3, 100, 0)


def test_the_allowlist_trims_the_profiles_a_card_offers() -> None:
    allow = (MigAllowlist(models=("A100-SXM4-40GB",), profiles=("1g.5gb", "7g.40gb")),)
    ledger = Ledger(mig_allowlist=allow)
    LedgerSync(ledger).on_node(Change("ADDED", mig_node("n1")))
    view = ledger.view("n1")
    assert view is not None
    assert [p.name for p in view.usage.devices[0].mig_profiles] == ["1g.5gb", "7g.40gb"]


# --- Filter and Bind over HTTP ----------------------------------------------------------------------------


def add_mig_node(emulator: KubeApiEmulator, name: str, n: int = 1) -> None:
    add_node(emulator, name, mig_cards(name, n))


async def test_filter_writes_the_mig_reservations_with_the_profiles_values_and_a_signature_over_them(
    emulator: KubeApiEmulator, settings: ExtenderSettings, tmp_path: Path
) -> None:
    key_file = tmp_path / "grant.key"
    key_file.write_bytes(b"k" * 32)
    async with serve(dataclasses.replace(settings, grant_key_file=str(key_file))) as extender:
        add_mig_node(emulator, "mig1")
        await eventually(lambda: "mig1" in extender.state["ledger"])
        pod = add_pod(emulator, "p1", containers=[gpu_container(gpus=2, mem=4000)])
        result = await extender.filter(pod, ["mig1"])
        assert result["NodeNames"] == ["mig1"], result
        anns = pod_annotations(emulator, "p1")
        mig = decode_mig_allocations(anns[MIG_ALLOCATIONS])
        assert [(m.container_index, m.device_index, m.gpu_uuid, m.profile) for m in mig] == [
            (0, 0, "MIGGPU-mig1-0", "1g.5gb"),
            (0, 1, "MIGGPU-mig1-0", "1g.5gb"),
        ]
        assert [m.placement.start for m in mig] == [6, 5]
        [devices] = decode_pod_devices(anns[DEVICES_ALLOCATED])[:1]
        assert [(d.usedmem, d.usedcores) for d in devices] == [(4864, 14), (4864, 14)]
        key = GrantKey(b"k" * 32)
        assert unverified_reason(key, pod["metadata"]["uid"], anns) == ""
        moved = {**anns, MIG_ALLOCATIONS: anns[MIG_ALLOCATIONS].replace('"start":5', '"start":0')}
        assert unverified_reason(key, pod["metadata"]["uid"], moved) != ""


async def test_the_next_pod_gets_a_free_placement_and_a_full_card_reports_hamis_reason(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    add_mig_node(emulator, "mig1")
    await eventually(lambda: "mig1" in extender.state["ledger"])
    first = add_pod(emulator, "big", containers=[gpu_container(mem=15000)])
    assert (await extender.filter(first, ["mig1"]))["NodeNames"] == ["mig1"]
    [big] = decode_mig_allocations(pod_annotations(emulator, "big")[MIG_ALLOCATIONS])
    assert (big.profile, big.placement.start) == ("3g.20gb", 4)
    second = add_pod(emulator, "also-big", containers=[gpu_container(mem=15000)])
    assert (await extender.filter(second, ["mig1"]))["NodeNames"] == ["mig1"]
    [other] = decode_mig_allocations(pod_annotations(emulator, "also-big")[MIG_ALLOCATIONS])
    assert (other.profile, other.placement.start) == ("3g.20gb", 0)
    third = add_pod(emulator, "one-more", containers=[gpu_container(mem=1000)])
    result = await extender.filter(third, ["mig1"])
    assert result["NodeNames"] is None
    assert result["FailedNodes"] == {"mig1": "1/1 CardMigTopologyInfeasible"}


async def test_filtering_again_onto_a_shared_card_drops_the_earlier_mig_reservation(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    add_mig_node(emulator, "mig1")
    add_node(emulator, "plain1")
    await eventually(lambda: "mig1" in extender.state["ledger"] and "plain1" in extender.state["ledger"])
    pod = add_pod(emulator, "p1", containers=[gpu_container(mem=1000)], annotations={"nvidia.com/vgpu-mode": "mig"})
    assert (await extender.filter(pod, ["mig1", "plain1"]))["NodeNames"] == ["mig1"]
    assert MIG_ALLOCATIONS in pod_annotations(emulator, "p1")
    # kube-scheduler filters the pod again, now only the shared node is offered
    stored = copy.deepcopy(emulator.store.get(PODS, "default", "p1"))
    del stored["metadata"]["annotations"]["nvidia.com/vgpu-mode"]
    assert (await extender.filter(stored, ["plain1"]))["NodeNames"] == ["plain1"]
    assert MIG_ALLOCATIONS not in pod_annotations(emulator, "p1")
    # the watch may still deliver the first filter's patch (the MIG booking) after the second filter booked the
    # pod anew; the ledger settles on the pod's latest state
    await eventually(lambda: placements_on(extender.state["ledger"], "mig1", "MIGGPU-mig1-0") == [])


async def test_bind_publishes_each_containers_reservations(
    emulator: KubeApiEmulator, extender: Served, bus: Bus
) -> None:
    add_mig_node(emulator, "mig1")
    await eventually(lambda: "mig1" in extender.state["ledger"])
    got: asyncio.Queue[PlacementDecision] = asyncio.Queue()

    async def on_placement(event: PlacementDecision, delivery: Delivery) -> None:
        await got.put(event)

    await bus.subscribe(subjects.placement("mig1"), PlacementDecision, on_placement)
    await eventually(lambda: extender.state["publisher"].bus is not None)
    pod = add_pod(emulator, "p1", containers=[gpu_container("a", mem=4000), gpu_container("b", mem=9000)])
    assert (await extender.filter(pod, ["mig1"]))["NodeNames"] == ["mig1"]
    assert await extender.bind(pod, "mig1") == {"Error": ""}
    decision = await asyncio.wait_for(got.get(), 5)
    first, second = decision.containers
    assert [(m.container_index, m.profile, m.placement.start) for m in first.mig] == [(0, "1g.5gb", 6)]
    assert [(m.container_index, m.profile, m.placement.start) for m in second.mig] == [(1, "2g.10gb", 4)]
    assert first.devices[0].usedmem_mib == 4864
