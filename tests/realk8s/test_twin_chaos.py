"""The real twin of tests/e2e/test_chaos.py: a node agent, the leading extender and NATS restarted under load
on the real control plane (kube-apiserver's own restart is in test_failover.py), and one server of a
three-server NATS cluster killed mid-run.

Afterwards every pod is allocated exactly as annotated or pending with kube-scheduler's reason, no GPU is
over-committed, and no placement is lost (every bound pod was admitted by its kubelet).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pytest

from hami_sim.realk8s import K8sBinaries
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import gpu_pod, mixed_workload
from hami_sim.stack.chaos import Disruption, run_with_chaos, submit_retrying
from hami_sim.waiting import eventually
from tests.realk8s.conftest import failed_scheduling, real_config

BATCH = 24
UNFIT = 2  # pods asking for more memory than any GPU has
NODES = 3


async def check(cluster: LocalCluster, disruptions: Sequence[Disruption], prefix: str) -> None:
    """Submit a batch, break something, repeat; then every pod is allocated as annotated or pending with a reason.

    The pods that fit nowhere are judged by kube-scheduler's FailedScheduling events: on the real control plane
    the scheduler is kube-scheduler, whose verdicts the stack does not hold."""
    workload = mixed_workload((len(disruptions) + 1) * BATCH, prefix=prefix)
    outcome = await run_with_chaos(cluster, workload, disruptions, settle=150.0)
    assert outcome.never_admitted == []
    assert outcome.refused == []
    assert outcome.report.problems == []
    assert outcome.report.allocated == len(outcome.uids)
    assert outcome.bound_not_admitted == [], "a bound pod was never admitted by its kubelet"

    unfit = [await submit_retrying(cluster, gpu_pod(f"{prefix}-too-big-{i}", mem=200_000)) for i in range(UNFIT)]
    for uid in unfit:

        async def reason(uid: str = uid) -> str:
            return await failed_scheduling(cluster, "default", uid)

        message = await eventually(reason, timeout=90, what="FailedScheduling from kube-scheduler")
        assert "CardInsufficientMemory" in message, message
    pods, _ = await cluster.kube.list_pods("default")
    assert not [p.metadata.name for p in pods if p.metadata.uid in unfit and p.spec.node_name]
    assert cluster.failures() == {}


def restarted(cluster: LocalCluster, process: str, action: Callable[[], Awaitable[None]]) -> Disruption:
    """``action``, and proof that it happened: a process of the stack so named runs under a new PID."""

    async def disrupt() -> None:
        before = {n: pid for n, pid in cluster.processes().items() if process in n}
        await action()
        after = {n: pid for n, pid in cluster.processes().items() if process in n}
        assert before, f"no {process} process in the stack"
        assert before.keys() == after.keys()
        assert before != after, (before, after)

    return disrupt


@pytest.mark.timeout(420)
async def test_after_agent_extender_and_nats_restarts_every_pod_is_allocated_once_or_pending_with_a_reason(
    k8s: K8sBinaries, tmp_path: Path, sockdir: Path
) -> None:
    async with LocalCluster(real_config(tmp_path, sockdir, nodes=NODES)) as cluster:
        await check(
            cluster,
            [
                lambda: cluster.restart_nodeagent("gpu-node-1"),
                restarted(cluster, "extender", cluster.restart_extender),  # the leading replica's only
                restarted(cluster, "nats", cluster.restart_nats),
            ],
            "chaos",
        )


@pytest.mark.timeout(420)
async def test_after_losing_one_server_of_a_nats_cluster_every_pod_is_allocated_once_or_pending_with_a_reason(
    k8s: K8sBinaries, tmp_path: Path, sockdir: Path
) -> None:
    """Three NATS servers, the placement stream on all three: one is killed (SIGKILL) mid-run and returns."""
    config = dataclasses.replace(real_config(tmp_path, sockdir, nodes=NODES), nats_servers=3)
    async with LocalCluster(config) as cluster:
        await check(cluster, [lambda: cluster.kill_nats_server(0)], "natsloss")
