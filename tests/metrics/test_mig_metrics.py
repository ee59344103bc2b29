"""MIG families: each runtime-ready instance once per node and once per container, gone with its pod."""

from __future__ import annotations

import msgspec

from hami_common.annotations import MigAllocation, MigPlacement
from hami_common.events import AllocationResult, NodePods, PlacementDecision, PodEnded
from hami_metrics.exposition import BuildInfo, Scrape, collect
from hami_metrics.state import ClusterState, Event, apply
from hami_metrics.textformat import TextRenderer

from .conftest import GPU_B, NODE, START_NS, Labels, container, inventory, labels, parse, placement, series

MIG_UUID = "MIG-0b3c5d1e-7f80-5a2b-9c3d-4e5f60718293"
SCHEDULED = MigAllocation(
    container_index=1, device_index=0, gpu_uuid=GPU_B, profile="3g.40gb", placement=MigPlacement(start=4, size=4)
)
REALISED = msgspec.structs.replace(SCHEDULED, mig_uuid=MIG_UUID, gpu_instance_id=2, compute_instance_id=0)


def mig_placement(*entries: MigAllocation) -> PlacementDecision:
    """A pod whose second container holds MIG instances of the card at index 1."""
    main = msgspec.structs.replace(container("main", (GPU_B, 40192, 42)), mig=entries)
    return placement("u1", container("sidecar"), main)


def mig_pod(*entries: MigAllocation) -> list[Event]:
    return [inventory(), mig_placement(*entries)]


def render(state: ClusterState, *, legacy: bool = False) -> dict[Labels, float]:
    build = BuildInfo(version="0", revision="r", build_date="d")
    text = TextRenderer().render(collect(state, Scrape(now_ns=START_NS, build=build, legacy=legacy))).decode()
    samples = parse(text)
    out = dict(series(samples, "hami_node_gpu_mig_instance_info"))
    out.update(series(samples, "hami_mig_device_info"))
    if legacy:
        out.update(series(samples, "nodeGPUMigInstance"))
        out.update(series(samples, "MigInfo"))
    return out


def fold(events: list[Event]) -> ClusterState:
    state = ClusterState()
    for event in events:
        state = apply(state, event, START_NS)
    return state


def allocated(*entries: MigAllocation) -> AllocationResult:
    return AllocationResult(
        pod_uid="u1", namespace="team-a", name="pod-u1", node=NODE, container="main", ok=True, staged=True,
        at_ns=START_NS, mig=entries,
    )  # fmt: skip


NODE_SERIES = labels(
    node=NODE, device_uuid=GPU_B, device_index="1", mig_uuid=MIG_UUID, profile="3g.40gb", gpu_instance_id="2",
    compute_instance_id="0", placement_start="4", placement_size="4", zone="vGPU",
)  # fmt: skip
CONTAINER_SERIES = labels(
    namespace="team-a", pod="pod-u1", container="main", vdevice_index="0", device_uuid=GPU_B, mig_uuid=MIG_UUID,
    profile="3g.40gb", gpu_instance_id="2", compute_instance_id="0", zone="vGPU",
)  # fmt: skip


def test_a_reservation_without_runtime_ids_is_not_exposed() -> None:
    assert render(fold(mig_pod(SCHEDULED))) == {}


def test_the_allocators_report_exposes_the_instance_on_its_node_and_container() -> None:
    state = fold([*mig_pod(SCHEDULED), allocated(REALISED)])
    assert render(state) == {NODE_SERIES: 1.0, CONTAINER_SERIES: 1.0}


def test_the_node_roster_carrying_runtime_ids_exposes_them_and_an_older_roster_does_not_hide_them() -> None:
    state = fold([*mig_pod(SCHEDULED), NodePods(node=NODE, pods=(mig_placement(REALISED),), at_ns=START_NS)])
    assert render(state) == {NODE_SERIES: 1.0, CONTAINER_SERIES: 1.0}
    stale = NodePods(node=NODE, pods=(mig_placement(SCHEDULED),), at_ns=START_NS)  # the extender's view, no runtime ids
    assert render(apply(state, stale, START_NS)) == {NODE_SERIES: 1.0, CONTAINER_SERIES: 1.0}


def test_the_instance_disappears_when_its_pod_ends() -> None:
    state = fold([*mig_pod(SCHEDULED), allocated(REALISED)])
    state = apply(state, PodEnded(node=NODE, pod_uid="u1", at_ns=START_NS), START_NS)
    assert render(state) == {}


def test_legacy_names_carry_the_same_instances() -> None:
    state = fold([*mig_pod(SCHEDULED), allocated(REALISED)])
    found = render(state, legacy=True)
    legacy_node = [k for k in found if ("nodeid", NODE) in k]
    legacy_ctr = [k for k in found if ("podnamespace", "team-a") in k]
    assert len(legacy_node) == 1
    assert ("migname", "3g.40gb") in legacy_node[0]
    assert len(legacy_ctr) == 1
    assert ("mig_uuid", MIG_UUID) in legacy_ctr[0]
