"""Failures of the real control plane mid-run: the leading scheduler replica (kube-scheduler and its
extender) killed by SIGKILL, and kube-apiserver restarted. No pod may be lost and no GPU booked twice."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hami_common.kube import Pod
from hami_sim.realk8s import K8sBinaries, uts_namespaces_work
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import audit as audit_cluster
from hami_sim.stack.audit import mixed_workload
from hami_sim.waiting import eventually
from tests.realk8s.conftest import real_config

Json = dict[str, Any]


async def pods_of(cluster: LocalCluster, uids: set[str]) -> list[Pod]:
    pods, _ = await cluster.kube.list_pods()
    return [p for p in pods if p.metadata.uid in uids]


async def submit_all(cluster: LocalCluster, pods: list[Json]) -> set[str]:
    created = await asyncio.gather(*(cluster.submit(pod) for pod in pods))
    return {str(pod["metadata"]["uid"]) for pod in created}


async def all_placed_exactly(cluster: LocalCluster, uids: set[str]) -> None:
    async with asyncio.timeout(300):
        admitted = await cluster.wait_admitted(uids)
    assert all(a.admission.ok for a in admitted.values()), [a for a in admitted.values() if not a.admission.ok]
    report = audit_cluster(await pods_of(cluster, uids), admitted, cluster.capacity())
    assert report.problems == []
    assert report.allocated == len(uids)


@pytest.mark.timeout(480)
@pytest.mark.skipif(not uts_namespaces_work(), reason="two replicas need a UTS namespace each (unshare --uts)")
async def test_the_leading_replica_killed_mid_run_loses_no_pod_and_books_no_gpu_twice(
    k8s: K8sBinaries, tmp_path: Path, sockdir: Path
) -> None:
    async with LocalCluster(real_config(tmp_path, sockdir, nodes=6, replicas=2)) as cluster:
        real = cluster.real
        assert real is not None
        leader = await eventually(lambda: asyncio.to_thread(real.leader), timeout=60, what="a replica leads")
        workload = mixed_workload(120, prefix="failover")
        uids = await submit_all(cluster, workload[:60])
        await eventually(lambda: len(cluster.admitted) >= 15, timeout=120, what="the first pods placed")
        await asyncio.to_thread(leader.kill)  # kube-scheduler and extender together, as a dead node
        uids |= await submit_all(cluster, workload[60:])
        await all_placed_exactly(cluster, uids)
        successor = await asyncio.to_thread(real.leader)
        assert successor is not None
        assert successor.index != leader.index
        assert real.extender_state(successor)["leader"] is True


@pytest.mark.timeout(420)
async def test_kube_apiserver_restarted_mid_run_loses_no_pod_and_books_no_gpu_twice(
    k8s: K8sBinaries, tmp_path: Path, sockdir: Path
) -> None:
    async with LocalCluster(real_config(tmp_path, sockdir, nodes=4)) as cluster:
        workload = mixed_workload(80, prefix="restart")
        uids = await submit_all(cluster, workload[:40])
        await eventually(lambda: len(cluster.admitted) >= 10, timeout=120, what="the first pods placed")
        await cluster.restart_api()
        uids |= await submit_all(cluster, workload[40:])
        await all_placed_exactly(cluster, uids)
        assert cluster.failures() == {}
