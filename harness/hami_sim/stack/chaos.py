"""Chaos under load, shared by the end-to-end test and the benchmark: submit, break something, repeat, audit.

:func:`run_with_chaos` submits the workload in batches and runs one disruption (a NATS restart, a node agent
restart, ...) after each batch but the last, then pods that fit nowhere; it waits for every fitting pod's
``Allocate`` and reports what a user would check: every pod allocated exactly as annotated or pending with a
reason, no GPU over-committed, no bound pod left unadmitted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from hami_common.annotations import NODE_LOCK, TRACE_CONTEXT
from hami_common.errors import TransientError
from hami_sim.kubelet import PodAdmission
from hami_sim.stack._cluster import LocalCluster
from hami_sim.stack._node import Admitted
from hami_sim.stack.audit import AuditReport, audit
from hami_sim.waiting import ConditionTimeoutError, eventually

__all__ = ["ChaosOutcome", "Disruption", "run_with_chaos", "submit_retrying"]

Json = dict[str, Any]
_OURS = TRACE_CONTEXT.split("/", 1)[0]  # the annotations' prefix
_SUBMIT_S: Final = 60.0  # how long a pod's creation is retried while a disruption lasts
Disruption = Callable[[], Awaitable[None]]


@dataclass(slots=True)
class ChaosOutcome:
    uids: list[str]
    admitted: dict[str, Admitted]
    never_admitted: list[str] = field(default_factory=list)  # one line per fitting pod no kubelet admitted
    refused: list[PodAdmission] = field(default_factory=list)  # admissions with an Allocate error
    report: AuditReport = field(default_factory=AuditReport)
    bound_not_admitted: list[str] = field(default_factory=list)  # bound pods the kubelet never admitted
    unfit_reasons: list[str] = field(default_factory=list)  # why each pod that fits nowhere is pending
    unfit_without_reason: int = 0
    failures: dict[str, list[BaseException | str]] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not (
            self.never_admitted
            or self.refused
            or self.report.problems
            or self.bound_not_admitted
            or self.unfit_without_reason
            or self.failures
        )


async def submit_retrying(cluster: LocalCluster, pod: Json) -> str:
    """Create the pod, retrying while the apiserver or the webhook restarts (as a user of kubectl would)."""

    async def attempt() -> str | None:
        try:
            created = await cluster.submit(pod)
        except TransientError:
            return None
        return str(created["metadata"]["uid"])

    return await eventually(attempt, timeout=_SUBMIT_S, what=f"pod {pod['metadata']['name']} created")


async def _stuck(cluster: LocalCluster, uids: set[str]) -> list[str]:
    """Where each pod that was never admitted stands, and which nodes still show a lock."""
    pods, _ = await cluster.kube.list_pods()
    nodes, _ = await cluster.kube.list_nodes()
    locks = [
        f"lock on {n.metadata.name}: {n.metadata.annotations[NODE_LOCK]}"
        for n in nodes
        if NODE_LOCK in n.metadata.annotations
    ]
    lines = [
        f"{p.metadata.name}: node={p.spec.node_name!r} verdict={cluster.verdict(p.metadata.uid)} "
        f"annotations={ {k: v for k, v in p.metadata.annotations.items() if k.startswith(_OURS)} }"
        for p in pods
        if p.metadata.uid in uids
    ]
    return lines + locks


async def run_with_chaos(
    cluster: LocalCluster,
    workload: Sequence[Json],
    disruptions: Sequence[Disruption],
    unfit: Sequence[Json] = (),
    *,
    settle: float = 150.0,
    concurrency: int = 32,
) -> ChaosOutcome:
    """Submit ``workload`` in ``len(disruptions) + 1`` batches with a disruption after each but the last."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    gate = asyncio.Semaphore(concurrency)

    async def submit(pod: Json) -> str:
        async with gate:
            return await submit_retrying(cluster, pod)

    size = -(-len(workload) // (len(disruptions) + 1))
    uids: list[str] = []
    for i, start in enumerate(range(0, len(workload), size)):
        uids += await asyncio.gather(*(submit(pod) for pod in workload[start : start + size]))
        if i < len(disruptions):
            await disruptions[i]()
    unfit_uids = [await submit(pod) for pod in unfit]

    outcome = ChaosOutcome(uids=uids, admitted={})
    try:
        async with asyncio.timeout(settle):
            await cluster.wait_admitted(uids)
    except TimeoutError:
        outcome.never_admitted = await _stuck(cluster, set(uids) - cluster.admitted.keys())
    outcome.elapsed_s = loop.time() - started
    outcome.admitted = {uid: cluster.admitted[uid] for uid in uids if uid in cluster.admitted}
    outcome.refused = [a.admission for a in outcome.admitted.values() if not a.admission.ok]
    pods, _ = await cluster.kube.list_pods()
    outcome.report = audit(pods, outcome.admitted, cluster.capacity())
    outcome.bound_not_admitted = [
        f"{p.metadata.name} on {p.spec.node_name}"
        for p in pods
        if p.spec.node_name and p.metadata.uid not in cluster.admitted
    ]

    def found() -> list[str]:
        verdicts = [cluster.verdict(uid) for uid in unfit_uids]
        return [", ".join(sorted(set(v.reasons.values()))) for v in verdicts if v is not None and v.reasons]

    def reasons() -> list[str] | None:
        return found() if len(found()) == len(unfit_uids) else None

    try:
        if unfit_uids:  # with none, [] is the answer at once (waiting for a truthy one would last the timeout)
            outcome.unfit_reasons = await eventually(
                reasons, timeout=30, what="a reason for every pod that does not fit"
            )
    except ConditionTimeoutError:
        outcome.unfit_reasons = found()
        outcome.unfit_without_reason = len(unfit_uids) - len(outcome.unfit_reasons)
    outcome.failures = cluster.failures()
    return outcome
