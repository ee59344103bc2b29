"""The pure fold: what each event does to the cluster state, staleness, pod ends, HAMi's collapsing."""

from __future__ import annotations

import pytest

from hami_common.events import AdmissionEvent, AllocationResult, DeviceSample, NodePods, PodEnded
from hami_metrics.nodemap import NodeMap
from hami_metrics.podusage import PodDevice, collapse
from hami_metrics.staleness import Retention, expire
from hami_metrics.state import NS_PER_S, ClusterState, apply

from .conftest import GPU_A, GPU_B, NODE, START_NS, container, inventory, placement, usage

RETENTION = Retention(
    node_staleness_ns=90 * NS_PER_S, usage_staleness_ns=30 * NS_PER_S, admission_horizon_ns=600 * NS_PER_S
)


def fold(*events: object, now_ns: int = START_NS) -> ClusterState:
    state = ClusterState()
    for event in events:
        state = apply(state, event, now_ns)  # type: ignore[arg-type]
    return state


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        pytest.param(
            [container("a", (GPU_A, 1000, 10)), container("b", (GPU_A, 2000, 20))],
            (PodDevice(uuid=GPU_A, usedmem_mib=3000, usedcores=30, slots=2),),
            id="app containers sharing a GPU add up and take one slot each",
        ),
        pytest.param(
            [
                container("i1", (GPU_A, 5000, 50), init=True),
                container("i2", (GPU_A, 1000, 70), init=True),
                container("a", (GPU_A, 2000, 20)),
            ],
            (PodDevice(uuid=GPU_A, usedmem_mib=5000, usedcores=70, slots=1),),
            id="init containers count at their peak, field by field, against the app sum",
        ),
        pytest.param(
            [container("a", (GPU_B, 1, 1), (GPU_A, 2, 2))],
            (
                PodDevice(uuid=GPU_A, usedmem_mib=2, usedcores=2, slots=1),
                PodDevice(uuid=GPU_B, usedmem_mib=1, usedcores=1, slots=1),
            ),
            id="one entry per GPU, sorted by uuid",
        ),
        pytest.param([container("cpu-only")], (), id="a container without GPUs adds nothing"),
    ],
)
def test_collapse_counts_a_pod_per_gpu_as_hami_does(containers: list, expected: tuple) -> None:  # type: ignore[type-arg]
    assert collapse(containers) == expected


def test_apply_returns_a_new_state_and_leaves_the_old_one_untouched() -> None:
    before = fold(inventory())
    after = apply(before, usage("u1"), START_NS)
    assert before.nodes[NODE].usage == {}
    assert len(after.nodes[NODE].usage) == 1
    assert after.applied == before.applied + 1


def test_usage_takes_the_vdevice_index_from_the_placement() -> None:
    state = fold(placement("u1", container("main", (GPU_B, 100, 10), (GPU_A, 100, 10))), usage("u1", GPU_A))
    (record,) = state.nodes[NODE].usage.values()
    assert record.vdevice_index == 1
    assert record.series[3] == "1"


def test_usage_without_placement_numbers_devices_in_the_order_first_seen() -> None:
    state = fold(usage("u1", GPU_B), usage("u1", GPU_A), usage("u1", GPU_B, used=5))
    indexes = {u.device_uuid: u.vdevice_index for u in state.nodes[NODE].usage.values()}
    assert indexes == {GPU_B: 0, GPU_A: 1}


def test_a_reported_vdevice_index_wins() -> None:
    state = fold(usage("u1", GPU_A, vdevice_index=3))
    assert next(iter(state.nodes[NODE].usage.values())).vdevice_index == 3


def test_pod_end_removes_its_placement_and_usage_and_ignores_late_samples() -> None:
    state = fold(
        placement("u1", container("main", (GPU_A, 100, 10))),
        placement("u2", container("main", (GPU_A, 100, 10))),
        usage("u1"),
        usage("u2"),
        PodEnded(node=NODE, pod_uid="u1", at_ns=START_NS),
        usage("u1"),
        placement("u1", container("main", (GPU_A, 100, 10))),
    )
    node = state.nodes[NODE]
    assert set(node.pods) == {"u2"}
    assert {key[0] for key in node.usage} == {"u2"}


def test_a_node_silent_past_staleness_is_dropped_with_everything_it_carried() -> None:
    state = fold(inventory(), placement("u1", container("main", (GPU_A, 100, 10))), usage("u1"))
    assert expire(state, START_NS + 90 * NS_PER_S, RETENTION).nodes.keys() == {NODE}
    gone = expire(state, START_NS + 91 * NS_PER_S, RETENTION)
    assert gone.nodes == {}
    assert gone.nodes_expired == 1


def test_a_placement_does_not_keep_a_silent_node_alive() -> None:
    state = fold(inventory())
    state = apply(state, placement("u1", container("main", (GPU_A, 100, 10))), START_NS + 60 * NS_PER_S)
    assert expire(state, START_NS + 91 * NS_PER_S, RETENTION).nodes == {}


def test_a_silent_container_is_dropped_while_its_node_lives_on() -> None:
    state = fold(inventory(), usage("u1"), DeviceSample(node=NODE, device_uuid=GPU_A, index=0, name="A100",
                 memory_used_bytes=1, at_ns=START_NS))  # fmt: skip
    later = START_NS + 31 * NS_PER_S
    state = apply(state, usage("u2"), later)
    trimmed = expire(state, later, RETENTION)
    assert {key[0] for key in trimmed.nodes[NODE].usage} == {"u2"}
    assert trimmed.nodes[NODE].host == {}


def test_expire_returns_the_same_state_when_nothing_is_old() -> None:
    state = fold(inventory(), usage("u1"))
    assert expire(state, START_NS + NS_PER_S, RETENTION) is state


def test_admission_to_bind_is_measured_for_admitted_gpu_pods() -> None:
    admitted = AdmissionEvent(pod_uid="u1", namespace="ns", name="p", allowed=True, mutated=True, gpu_containers=1,
                              at_ns=START_NS)  # fmt: skip
    state = fold(admitted, placement("u1", container("main", (GPU_A, 1, 1)), bind_ns=START_NS + NS_PER_S // 5))
    hist = state.path.admission_to_bind
    assert hist.count == 1
    assert hist.total == pytest.approx(0.2)
    assert state.path.pending_admissions == {}
    assert state.path.admissions == {("ns", "mutated"): 1}


def test_bind_to_allocate_and_allocation_counts_are_split_by_path() -> None:
    def allocated(staged: bool, ok: bool, at_ns: int) -> AllocationResult:
        return AllocationResult(pod_uid="u1", namespace="ns", name="p", node=NODE, container="main", ok=ok,
                                staged=staged, at_ns=at_ns)  # fmt: skip

    state = fold(
        placement("u1", container("main", (GPU_A, 1, 1))),
        allocated(True, True, START_NS + NS_PER_S // 100),
        allocated(False, False, START_NS + 2 * NS_PER_S),
    )
    assert state.path.allocations == {("staged", "ok"): 1, ("fallback", "failed"): 1}
    assert state.path.bind_to_allocate["staged"].total == pytest.approx(0.01)
    assert state.path.bind_to_allocate["fallback"].total == pytest.approx(2.0)


def test_admissions_never_bound_are_forgotten_after_the_horizon() -> None:
    admitted = AdmissionEvent(pod_uid="u1", namespace="ns", name="p", allowed=True, gpu_containers=1, at_ns=START_NS)
    state = fold(admitted)
    assert expire(state, START_NS + 601 * NS_PER_S, RETENTION).path.pending_admissions == {}


def test_node_map_set_returns_a_new_map_and_leaves_the_old_one() -> None:
    empty: NodeMap[int] = NodeMap()
    one = empty.set("a", 1)
    two = one.set("b", 2).set("a", 3)
    assert (len(empty), len(one), len(two)) == (0, 1, 2)
    assert one == {"a": 1}
    assert two == {"a": 3, "b": 2}
    assert "b" in two
    assert "b" not in one
    assert two.get("zz") is None
    assert NodeMap((f"n{i}", i) for i in range(500)) == {f"n{i}": i for i in range(500)}


def test_a_roster_ends_pods_it_no_longer_lists_and_adds_those_it_does() -> None:
    kept = placement("u1", container("main", (GPU_A, 100, 10)))
    state = fold(kept, placement("u2", container("main", (GPU_A, 100, 10))), usage("u2"))
    before = state.nodes[NODE].pods["u1"]
    missed = placement("u3", container("main", (GPU_B, 200, 20)))  # placed while the aggregator was away
    state = apply(state, NodePods(node=NODE, pods=(kept, missed), at_ns=START_NS), START_NS)
    node = state.nodes[NODE]
    assert set(node.pods) == {"u1", "u3"}
    assert node.pods["u1"] is before  # unchanged pods keep their value (and their rendered lines)
    assert node.usage == {}
    assert "u2" in node.ended
    assert apply(state, usage("u2"), START_NS).nodes[NODE].usage == {}  # a late sample stays gone


def test_a_roster_listing_an_ended_pod_brings_it_back() -> None:
    placed = placement("u1", container("main", (GPU_A, 100, 10)))
    state = fold(placed, PodEnded(node=NODE, pod_uid="u1", at_ns=START_NS))
    state = apply(state, NodePods(node=NODE, pods=(placed,), at_ns=START_NS), START_NS)
    assert set(state.nodes[NODE].pods) == {"u1"}
    assert state.nodes[NODE].ended == {}
