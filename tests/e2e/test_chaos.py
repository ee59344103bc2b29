"""Chaos during a run: NATS, a node agent, the extender and the API emulator's watches restart under load.

Afterwards every pod is either allocated exactly as annotated or pending with a reason, no GPU is
over-committed, and no placement is lost (every bound pod was admitted by its kubelet).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from hami_common.annotations import NODE_LOCK, TRACE_CONTEXT
from hami_common.errors import TransientError
from hami_sim.stack import LocalCluster
from hami_sim.stack.audit import audit, gpu_pod, mixed_workload
from hami_sim.waiting import eventually
from tests.e2e.conftest import stack_config

BATCH = 30
HAMI = TRACE_CONTEXT.split("/", 1)[0]  # the annotations' prefix
UNFIT = 3  # pods asking for more memory than any GPU has


@pytest.fixture
async def cluster(tmp_path: Path, sockdir: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(stack_config(tmp_path, sockdir, nodes=10)) as running:
        yield running


async def submit(cluster: LocalCluster, pod: dict[str, Any]) -> str:
    """Create the pod, retrying while the apiserver or the webhook is restarting (as kubectl's user would)."""

    async def attempt() -> str | None:
        try:
            created = await cluster.submit(pod)
        except TransientError:
            return None
        return str(created["metadata"]["uid"])

    return await eventually(attempt, timeout=60, what=f"pod {pod['metadata']['name']} created")


async def stuck(cluster: LocalCluster, uids: set[str]) -> str:
    """Where each pod that was never admitted stands, for the failure message."""
    pods, _ = await cluster.kube.list_pods()
    lines = [
        f"{p.metadata.name}: node={p.spec.node_name!r} verdict={cluster.verdict(p.metadata.uid)} "
        f"annotations={ {k: v for k, v in p.metadata.annotations.items() if k.startswith(HAMI)} }"
        for p in pods
        if p.metadata.uid in uids
    ]
    nodes, _ = await cluster.kube.list_nodes()
    locks = [
        f"{n.metadata.name}: {n.metadata.annotations.get(NODE_LOCK)}"
        for n in nodes
        if NODE_LOCK in n.metadata.annotations
    ]
    bound = [f"{p.metadata.name} on {p.spec.node_name}" for p in pods if p.metadata.uid in uids and p.spec.node_name]
    return f"{len(uids)} pods never admitted; locks {locks}; bound {bound}:\n" + "\n".join(lines[:5])


async def run_with_chaos(
    cluster: LocalCluster, chaos: list[Callable[[], Awaitable[None]]], settle: float = 150.0
) -> None:
    """Submit a batch, break something, repeat; then check every pod and every GPU."""
    workload = mixed_workload((len(chaos) + 1) * BATCH, prefix="chaos")
    unfit = [gpu_pod(f"too-big-{i}", mem=200_000) for i in range(UNFIT)]
    uids: list[str] = []
    for i, start in enumerate(range(0, len(workload), BATCH)):
        uids += await asyncio.gather(*(submit(cluster, pod) for pod in workload[start : start + BATCH]))
        if i < len(chaos):
            await chaos[i]()
    unfit_uids = [await submit(cluster, pod) for pod in unfit]

    try:
        async with asyncio.timeout(settle):
            admitted = await cluster.wait_admitted(uids)
    except TimeoutError:
        pytest.fail(await stuck(cluster, set(uids) - cluster.admitted.keys()))

    refused = [a.admission for a in admitted.values() if not a.admission.ok]
    assert refused == []
    pods, _ = await cluster.kube.list_pods()
    report = audit(pods, admitted, cluster.capacity())
    assert report.problems == []
    assert report.allocated == len(uids)
    bound = {p.metadata.uid for p in pods if p.spec.node_name}
    assert bound == set(uids), "a bound pod was never admitted by its kubelet, or an unfit pod was bound"

    def reasons() -> list[str] | None:
        verdicts = [cluster.verdict(uid) for uid in unfit_uids]
        found = [", ".join(sorted(set(v.reasons.values()))) for v in verdicts if v is not None and v.reasons]
        return found if len(found) == UNFIT else None

    pending = await eventually(reasons, timeout=30, what="a reason for every pod that does not fit")
    assert all("CardInsufficientMemory" in reason for reason in pending), pending
    assert cluster.failures() == {}


@pytest.mark.timeout(300)
async def test_after_agent_extender_and_apiserver_restarts_every_pod_is_allocated_once_or_pending_with_a_reason(
    cluster: LocalCluster,
) -> None:
    await run_with_chaos(
        cluster,
        [lambda: cluster.restart_nodeagent("gpu-node-3"), cluster.restart_extender, cluster.restart_api],
    )


@pytest.mark.xfail(
    reason="after a NATS restart a node's HAMi lock annotation (hami.io/mutex.lock) can outlive the allocated pod "
    "that took it, so every later bind to that node fails with 'node lock contention' until the 300 s expiry; "
    "reported to the extender and allocator owners",
    strict=False,
)
@pytest.mark.timeout(300)
async def test_after_a_nats_restart_every_pod_is_allocated_once_or_pending_with_a_reason(
    cluster: LocalCluster,
) -> None:
    await run_with_chaos(cluster, [cluster.restart_nats], settle=60.0)
