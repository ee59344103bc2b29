"""Chaos during a run: NATS, a node agent, the extender and the API emulator's watches restart under load.

Afterwards every pod is either allocated exactly as annotated or pending with a reason, no GPU is
over-committed, and no placement is lost (every bound pod was admitted by its kubelet).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import gpu_pod, mixed_workload
from hami_sim.stack.chaos import Disruption, run_with_chaos
from tests.e2e.conftest import stack_config

BATCH = 30
UNFIT = 3  # pods asking for more memory than any GPU has


@pytest.fixture
async def cluster(tmp_path: Path, sockdir: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(stack_config(tmp_path, sockdir, nodes=10)) as running:
        yield running


async def check(cluster: LocalCluster, disruptions: list[Disruption], settle: float = 150.0) -> None:
    """Submit a batch, break something, repeat; then every pod is allocated as annotated or pending with a reason."""
    workload = mixed_workload((len(disruptions) + 1) * BATCH, prefix="chaos")
    unfit = [gpu_pod(f"too-big-{i}", mem=200_000) for i in range(UNFIT)]
    outcome = await run_with_chaos(cluster, workload, disruptions, unfit, settle=settle)
    assert outcome.never_admitted == []
    assert outcome.refused == []
    assert outcome.report.problems == []
    assert outcome.report.allocated == len(outcome.uids)
    assert outcome.bound_not_admitted == [], "a bound pod was never admitted by its kubelet, or an unfit pod was bound"
    assert outcome.unfit_without_reason == 0
    assert all("CardInsufficientMemory" in reason for reason in outcome.unfit_reasons), outcome.unfit_reasons
    assert outcome.failures == {}


@pytest.mark.timeout(300)
async def test_after_agent_extender_and_apiserver_restarts_every_pod_is_allocated_once_or_pending_with_a_reason(
    cluster: LocalCluster,
) -> None:
    await check(
        cluster,
        [lambda: cluster.restart_nodeagent("gpu-node-3"), cluster.restart_extender, cluster.restart_api],
    )


@pytest.mark.timeout(300)
async def test_after_a_nats_restart_every_pod_is_allocated_once_or_pending_with_a_reason(
    cluster: LocalCluster,
) -> None:
    await check(cluster, [cluster.restart_nats], settle=60.0)


@pytest.mark.timeout(300)
async def test_after_losing_one_server_of_a_nats_cluster_every_pod_is_allocated_once_or_pending_with_a_reason(
    tmp_path: Path, sockdir: Path
) -> None:
    """Three NATS servers, as the production overlay runs them, the placement stream on all three: one is
    killed (SIGKILL) mid-run and returns; no placement is lost and none is served twice."""
    config = dataclasses.replace(stack_config(tmp_path, sockdir, nodes=10), nats_servers=3)
    async with LocalCluster(config) as cluster:
        await check(cluster, [lambda: cluster.kill_nats_server(0)], settle=90.0)
