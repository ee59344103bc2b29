"""[realk8s] The event recorder against the real kube-apiserver: repeated events are one counted object,
similar ones fold, as client-go's EventCorrelator leaves them (issue 18.5)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from hami_common.kube import EventRecorder, KubeClient, KubeSettings, reference_to
from hami_common.kube._events import AGGREGATE_MAX_EVENTS, COMBINED_PREFIX
from hami_sim.realk8s import ControlPlane


async def test_real_apiserver_keeps_one_counted_event_per_repeated_reason(plane: ControlPlane, tmp_path: Path) -> None:
    plane.ensure_namespace("events-check")
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pending", "namespace": "events-check"},
        "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "cuda"}]},
    }
    plane.create("", "v1", "pods", "events-check", body)
    settings = KubeSettings(kubeconfig=str(plane.write_kubeconfig(tmp_path / "admin")), kube_timeout=10.0)
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def clock() -> dt.datetime:
        return now

    async with KubeClient.from_settings(settings) as kube:
        ref = reference_to(await kube.get_pod("events-check", "pending"), "Pod")
        recorder = EventRecorder(kube, component="hami-scheduler", clock=clock)
        for _ in range(12):
            now += dt.timedelta(seconds=2)
            assert await recorder.record(ref, "Warning", "FailedScheduling", "0/4 nodes are available")
        for i in range(12):
            assert await recorder.record(ref, "Warning", "FilteringFailed", f"attempt {i}")
        events = await kube.list_events("events-check", field_selector="involvedObject.name=pending")
    failed = [e for e in events if e.reason == "FailedScheduling"]
    assert [(e.count, e.message) for e in failed] == [(12, "0/4 nodes are available")]
    folded = [e for e in events if e.reason == "FilteringFailed"]
    assert len(folded) == AGGREGATE_MAX_EVENTS
    assert [e.count for e in folded if e.message == COMBINED_PREFIX + "attempt 11"] == [12 - (AGGREGATE_MAX_EVENTS - 1)]
