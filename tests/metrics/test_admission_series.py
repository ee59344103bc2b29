"""Issue 28 item 9: forged AdmissionReviews must not grow ``hami_scheduling_admissions_total`` without bound.

Anyone who reaches the webhook can post reviews, and each one became an AdmissionEvent whose namespace was a
new series, never pruned. The aggregator now labels at most a fixed number of namespaces, folds the rest and
every namespace gone quiet into one ``namespace="_other"`` series, so the sum over namespaces stays a counter.
"""

from __future__ import annotations

import random
import string

from hami_common.events import AdmissionEvent
from hami_metrics.exposition import BuildInfo, Scrape, collect
from hami_metrics.staleness import Retention, expire
from hami_metrics.state import NS_PER_S, ClusterState, apply
from hami_metrics.textformat import TextRenderer

from .conftest import START_NS

SERIES = "hami_scheduling_admissions_total{"
HOUR_NS = 3600 * NS_PER_S


def admitted(namespace: str, uid: str, allowed: bool = True) -> AdmissionEvent:
    return AdmissionEvent(pod_uid=uid, namespace=namespace, name="p", allowed=allowed, at_ns=START_NS)


def admission_series(state: ClusterState) -> dict[str, float]:
    text = TextRenderer().render(collect(state, Scrape(now_ns=START_NS, build=BuildInfo(version="t")))).decode()
    rows = [line for line in text.splitlines() if line.startswith(SERIES)]
    return {labels: float(value) for labels, value in (row.rsplit(" ", 1) for row in rows)}


def random_namespace(rng: random.Random) -> str:
    return "forged-" + "".join(rng.choices(string.ascii_lowercase + string.digits, k=12))


def test_thousands_of_random_namespaces_make_a_bounded_number_of_series_and_real_ones_still_count() -> None:
    rng = random.Random(28)
    state = ClusterState()
    for i in range(3):  # a real namespace, seen before the flood
        state = apply(state, admitted("team-a", f"real-{i}"), START_NS)
    for i in range(5000):
        state = apply(state, admitted(random_namespace(rng), f"forged-{i}"), START_NS)
    state = apply(state, admitted("team-a", "real-3"), START_NS)
    series = admission_series(state)
    assert len(series) <= 1001, f"{len(series)} series for one result: unbounded"
    assert series['hami_scheduling_admissions_total{namespace="team-a",result="allowed"}'] == 4
    assert sum(series.values()) == 5004, "nothing is lost: what has no label of its own counts under _other"
    assert series['hami_scheduling_admissions_total{namespace="_other",result="allowed"}'] > 0


def test_a_namespace_quiet_past_its_staleness_is_folded_into_other_and_the_sum_stays_a_counter() -> None:
    retention = Retention(
        node_staleness_ns=90 * NS_PER_S,
        usage_staleness_ns=30 * NS_PER_S,
        admission_horizon_ns=600 * NS_PER_S,
        admission_namespace_staleness_ns=HOUR_NS,
    )
    state = ClusterState()
    for uid, namespace, allowed in (("1", "deleted", True), ("2", "deleted", False), ("3", "live", True)):
        state = apply(state, admitted(namespace, uid, allowed), START_NS)
    state = apply(state, admitted("live", "4"), START_NS + HOUR_NS)
    state = expire(state, START_NS + HOUR_NS + 1, retention)
    assert admission_series(state) == {
        'hami_scheduling_admissions_total{namespace="_other",result="allowed"}': 1,
        'hami_scheduling_admissions_total{namespace="_other",result="denied"}': 1,
        'hami_scheduling_admissions_total{namespace="live",result="allowed"}': 2,
    }
    again = apply(state, admitted("deleted", "5"), START_NS + HOUR_NS + 2)  # a namespace of the same name, anew
    assert admission_series(again)['hami_scheduling_admissions_total{namespace="deleted",result="allowed"}'] == 1
