"""The web page's view models and history, from folded states (no HTTP: the routes are tested in test_webui)."""

from __future__ import annotations

import msgspec
import pytest

from hami_common.annotations import DeviceInfo
from hami_common.events import (
    AdmissionEvent,
    DeviceSample,
    FilterRefusal,
    PodEnded,
    QuotaResource,
    QuotaUsage,
    RefusalReason,
)
from hami_metrics import webview
from hami_metrics.history import History, HistoryLimits
from hami_metrics.state import NS_PER_S, ClusterState, apply

from .conftest import GPU_A, GPU_B, NODE, START_NS, container, inventory, placement, usage

MIB = 1 << 20
ASCEND = "ASCEND-0000"


def fold(*events: object, now_ns: int = START_NS) -> ClusterState:
    state = ClusterState()
    for event in events:
        state = apply(state, event, now_ns)  # type: ignore[arg-type]
    return state


def sample(gpu: str, used_mib: int, util: int, node: str = NODE) -> DeviceSample:
    return DeviceSample(node=node, device_uuid=gpu, index=0, name="A100", memory_used_bytes=used_mib * MIB,
                        utilization_percent=util, at_ns=START_NS)  # fmt: skip


def two_pods() -> ClusterState:
    return fold(
        inventory(),
        placement("u1", container("main", (GPU_A, 1000, 30))),
        placement("u2", container("main", (GPU_A, 2000, 20), (GPU_B, 500, 10))),
        usage("u1", GPU_A, used=300 * MIB),
        sample(GPU_A, 2500, 40),
    )


def test_a_card_shows_who_books_it_and_what_its_sample_says_it_uses() -> None:
    rows = {c.uuid: c for c in webview.cards(two_pods())}
    a, b = rows[GPU_A], rows[GPU_B]
    assert (a.memory_booked_mib, a.cores_booked, a.slices_booked, a.pods) == (3000, 50, 2, ["u1", "u2"])
    assert (a.memory_used_mib, a.utilization_percent) == (2500, 40)
    assert (a.vendor, a.model, a.memory_mib) == ("NVIDIA", "NVIDIA-A100", 81920)
    # no device sample for B: its used figures are unknown, not zero
    assert (b.memory_booked_mib, b.memory_used_mib, b.utilization_percent) == (500, None, None)


def test_the_overview_sums_by_model_and_keeps_unknown_usage_unknown() -> None:
    view = webview.overview(two_pods())
    assert (view.nodes, view.cards, view.pods_bound, view.pods_pending) == (1, 2, 2, 0)
    assert (view.memory_mib, view.memory_booked_mib, view.memory_used_mib) == (163840, 3500, 2500)
    assert (view.cards_reporting, view.utilization_percent) == (1, 40.0)
    assert [(m.vendor, m.model, m.cards) for m in view.models] == [("NVIDIA", "NVIDIA-A100", 2)]
    empty = webview.overview(fold(inventory()))
    assert (empty.memory_used_mib, empty.utilization_percent, empty.cards_reporting) == (None, None, 0)


def test_every_vendor_appears_under_its_own_word() -> None:
    devices = (DeviceInfo(id=ASCEND, index=0, count=4, devmem=65536, devcore=100, type="Ascend910B3", health=True),
               DeviceInfo(id="DCU-1", index=1, count=4, devmem=65520, devcore=100, type="DCU-K100_AI", health=True),
               DeviceInfo(id="n-cambricon-mlu-0", index=2, count=4, devmem=49152, devcore=100, type="MLU370",
                          health=True))  # fmt: skip
    view = webview.overview(fold(inventory(devices=devices)))
    assert {(m.vendor, m.model) for m in view.models} == {
        ("Ascend", "Ascend910B3"),
        ("DCU", "DCU-K100_AI"),
        ("MLU", "MLU370"),
    }


def test_a_workload_links_its_node_and_cards_and_says_when_it_has_no_usage_report() -> None:
    state = two_pods()
    rows = {w.uid: w for w in webview.workloads(state, START_NS)}
    assert (rows["u1"].node, rows["u1"].cards, rows["u1"].memory_used_mib) == (NODE, [GPU_A], 300.0)
    assert (rows["u2"].cards, rows["u2"].memory_booked_mib, rows["u2"].memory_used_mib) == ([GPU_A, GPU_B], 2500, None)
    detail = webview.workload_detail(state, "u2", START_NS + 5 * NS_PER_S)
    assert detail is not None
    assert [(g.uuid, g.memory_mib, g.cores) for g in detail.grants] == [(GPU_A, 2000, 20), (GPU_B, 500, 10)]
    assert detail.usage == []
    assert any("no usage report" in line for line in detail.path)
    card = webview.card_detail(state, GPU_A)
    assert card is not None
    assert [h.uid for h in card.holders] == ["u1", "u2"]


def test_a_pending_pod_is_listed_with_why_it_waits_until_it_is_placed() -> None:
    admitted = AdmissionEvent(pod_uid="p1", namespace="ns", name="big", allowed=True, gpu_containers=1,
                              at_ns=START_NS)  # fmt: skip
    state = fold(inventory(), admitted)
    (row,) = webview.workloads(state, START_NS + 12 * NS_PER_S)
    assert (row.state, row.name, row.node, row.waiting_s) == ("pending", "big", "", 12.0)
    assert "not placed yet" in row.reason
    assert webview.overview(state).pods_pending == 1
    placed = apply(state, placement("p1", container("main", (GPU_A, 1, 1))), START_NS)
    assert [w.state for w in webview.workloads(placed, START_NS)] == ["bound"]


def test_unknown_names_find_nothing() -> None:
    state = two_pods()
    assert webview.node_detail(state, "nope", START_NS) is None
    assert webview.card_detail(state, "GPU-nope") is None
    assert webview.workload_detail(state, "nope", START_NS) is None


def test_node_detail_lists_its_cards_and_pods() -> None:
    detail = webview.node_detail(two_pods(), NODE, START_NS + 3 * NS_PER_S)
    assert detail is not None
    assert [c.uuid for c in detail.cards] == [GPU_A, GPU_B]
    assert [p.uid for p in detail.pods] == ["u1", "u2"]
    assert (detail.node.memory_used_mib, detail.node.last_seen_s, detail.node.vendors) == (2500, 3.0, ["NVIDIA"])


def test_quotas_show_use_against_the_limit_or_no_limit() -> None:
    quota = QuotaUsage(namespace="team-a", at_ns=START_NS, resources=(
        QuotaResource(name="nvidia.com/gpumem", used=3000, limit=4000),
        QuotaResource(name="nvidia.com/gpucores", used=50)))  # fmt: skip
    rows = webview.quotas(fold(quota))
    assert [(r.resource, r.used, r.limit, r.percent) for r in rows] == [
        ("nvidia.com/gpucores", 50, None, None),
        ("nvidia.com/gpumem", 3000, 4000, 75.0),
    ]


# --- history ---------------------------------------------------------------------------------------------


def test_history_keeps_the_last_samples_and_gaps_where_no_figure_came() -> None:
    history = History(HistoryLimits(interval_ns=NS_PER_S, capacity=3, max_series=10, forget_ns=100 * NS_PER_S))
    state = two_pods()
    for i in range(5):
        history.record(state, START_NS + i * NS_PER_S)
    card = history.card(GPU_A)
    assert card is not None
    assert card.t == [(START_NS + i * NS_PER_S) / NS_PER_S for i in (2, 3, 4)]  # the oldest two dropped
    assert card.values[card.fields.index("memory_used_mib")] == [2500.0] * 3
    b = history.card(GPU_B)
    assert b is not None
    assert b.values[b.fields.index("memory_used_mib")] == [None] * 3  # no sample: a gap, not zero
    pod = history.pod("u2")
    assert pod is not None
    assert pod.values[pod.fields.index("memory_used_mib")] == [None] * 3
    cluster = history.cluster()
    assert cluster.values[cluster.fields.index("memory_booked_mib")] == [3500.0] * 3


def test_history_forgets_ended_pods_and_refuses_series_beyond_its_cap() -> None:
    history = History(HistoryLimits(interval_ns=NS_PER_S, capacity=4, max_series=3, forget_ns=10 * NS_PER_S))
    state = two_pods()  # two cards and two pods: four series wanted, three kept
    history.record(state, START_NS)
    assert (history.series, history.refused) == (3, 1)
    ended = apply(state, PodEnded(node=NODE, pod_uid="u1", at_ns=START_NS), START_NS)
    history.record(ended, START_NS + 11 * NS_PER_S)
    assert history.pod("u1") is None  # not seen for over forget_ns
    assert history.card(GPU_A) is not None


@pytest.mark.parametrize(("word", "vendor"), [("NVIDIA-H100", "NVIDIA"), ("", "unknown"), ("910", "910")])
def test_vendor_words(word: str, vendor: str) -> None:
    assert webview.vendor_of(word) == vendor


def test_a_pod_admitted_before_it_had_a_uid_waits_under_its_name_until_placed() -> None:
    # a mutating webhook meets a pod before the apiserver gives it a uid: the admission carries none
    admitted = [AdmissionEvent(pod_uid="", namespace="ns", name=n, allowed=True, gpu_containers=1, at_ns=START_NS)
                for n in ("a", "b")]  # fmt: skip
    state = fold(inventory(), *admitted)
    assert [w.uid for w in webview.workloads(state, START_NS)] == ["ns_a", "ns_b"]
    assert webview.workload_detail(state, "ns_b", START_NS) is not None
    decision = msgspec.structs.replace(placement("u-a", container("main", (GPU_A, 1, 1)), namespace="ns"), name="a")
    placed = apply(state, decision, START_NS + NS_PER_S)
    assert [(w.uid, w.state) for w in webview.workloads(placed, START_NS)] == [("u-a", "bound"), ("ns_b", "pending")]
    assert placed.path.admission_to_bind.count == 1


def test_a_pending_pod_says_what_the_filter_refused_it_for() -> None:
    admitted = AdmissionEvent(pod_uid="", namespace="ns", name="big", allowed=True, gpu_containers=1, at_ns=START_NS)
    reasons = (
        RefusalReason(reason="CardInsufficientMemory", nodes=3),
        RefusalReason(reason="node unregistered", nodes=1),
    )
    refusal = FilterRefusal(pod_uid="u-big", namespace="ns", name="big", nodes=4, reasons=reasons,
                            at_ns=START_NS + 2 * NS_PER_S)  # fmt: skip
    state = fold(inventory(), admitted)
    (before,) = webview.workloads(state, START_NS)
    assert "has not refused it" in before.reason
    refused = apply(state, refusal, START_NS + 2 * NS_PER_S)
    (row,) = webview.workloads(refused, START_NS + 5 * NS_PER_S)
    assert "no node fits (4 nodes offered: 3 CardInsufficientMemory, 1 node unregistered; 3 s ago)" in row.reason
    # a refusal of a pod never seen admitted (the service started later) is not kept: nothing would remove it
    stranger = msgspec.structs.replace(refusal, pod_uid="u-other", name="other")
    assert apply(refused, stranger, START_NS).path.pending_admissions == refused.path.pending_admissions
