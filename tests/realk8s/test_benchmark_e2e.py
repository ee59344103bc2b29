"""``benchmarks/e2e.py --kube real --quick`` runs on the real control plane and reports what issue [floor]
asks of it: to bound and to allocated apart, the anchor's ratio, kube-apiserver's own request and webhook
counts per pod for both arms, and CPU per pod by side."""

from __future__ import annotations

import pytest

from hami_sim.realk8s import K8sBinaries
from tests.test_benchmarks import run_benchmark


@pytest.mark.timeout(600)
def test_the_end_to_end_benchmark_reports_the_control_planes_work_per_pod(k8s: K8sBinaries) -> None:
    summary = run_benchmark("e2e.py", "--quick", "--kube", "real")
    pods = summary["pods"]
    assert summary["audit_problems"] == 0
    assert summary["allocate_errors"] == 0
    # a pod is bound before it is allocated; the ratio is against plain pods of the same run
    assert 0 < summary["bound_p50_ms"] <= summary["allocated_p50_ms"]
    assert summary["ratio_bound"] == round(summary["bound_pods_per_s"] / summary["baseline_pods_per_s"], 2)
    # kube-apiserver counted every pod's create and binding, in both arms
    for prefix in ("", "baseline_"):
        requests = summary[f"{prefix}apiserver_requests_per_pod"]
        assert requests["POST pods"] >= 1.0
        assert requests["POST pods/binding"] >= 1.0
        assert summary[f"{prefix}apiserver_writes_per_pod"] >= 2.0
    # the webhook: once per GPU pod at its creation, never for our own services' updates; plain pods skip it
    assert summary["webhook_calls_per_pod"] == {"vgpu.hami.io CREATE": 1.0}
    assert summary["baseline_webhook_calls_per_pod"] == {}
    assert summary["cpu_ms_per_pod_control_plane"] > summary["baseline_cpu_ms_per_pod_control_plane"] > 0
    assert summary["cpu_ms_per_pod_nodes"] > 0
    assert summary["cpu_ratio_control_plane"] > 1
    assert pods == 100
