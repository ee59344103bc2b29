"""Pre-staging: turn this node's placement decisions into Allocate answers before the kubelet asks.

:meth:`Prestager.on_placement` is the handler of the node's durable JetStream consumer. It builds every
container's answer with :mod:`hami_common.allocation`, creates the host files the answers mount, and writes
the pod's entry into the staging store (:mod:`hami_common.staging`: atomic, fsynced, ordered by bind time).
The bus acknowledges only after the handler returns, so an agent killed in between gets the decision again;
the store ignores a second put of the same pod, so a redelivered decision is staged exactly once.

:meth:`Prestager.reconcile` removes the entries of pods that were deleted or finished, and of pods the
node's pod watch never saw within ``orphan_grace`` of their bind time (deleted while the agent was down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Final, Literal

from hami_common import logkeys, spans
from hami_common.allocation import NodeAllocationConfig, build_pod, from_placement
from hami_common.bus import Delivery
from hami_common.errors import InvalidInput, TransientError
from hami_common.events import PlacementDecision
from hami_common.staging import StagedPod, StagingStore
from hami_common.tracing import to_annotation, tracer
from hami_nodeagent.pods import PodIndex

__all__ = ["Outcome", "Prestager"]

log = logging.getLogger(__name__)

Outcome = Literal["staged", "repeated", "empty"]
_OUTCOMES: Final[dict[Outcome, str]] = {
    "staged": "staged",
    "repeated": "staged before, acknowledged again",
    "empty": "no container has a device, nothing to stage",
}


@dataclass(eq=False)
class Prestager:
    node: str
    store: StagingStore
    config: NodeAllocationConfig
    pods: PodIndex | None = None
    orphan_grace: float = 60.0
    clock: Callable[[], int] = time.time_ns
    staged: int = 0  # entries written
    repeated: int = 0  # decisions that were staged before (redeliveries)
    skipped: int = 0  # decisions of pods already gone, or without a device to stage

    # --- the consumer ---------------------------------------------------------------------------------------

    def stage(self, decision: PlacementDecision, trace_context: str = "") -> Outcome:
        """Build and write one pod's entry (blocking). InvalidInput for a decision no retry can fix."""
        allocations = build_pod(from_placement(decision), self.config)
        if not allocations:
            return "empty"
        wrote = self.store.put(
            StagedPod(
                pod_uid=decision.pod_uid,
                namespace=decision.namespace,
                name=decision.name,
                node=decision.node,
                bind_time_ns=decision.bind_time_ns,
                trace_context=trace_context,
                containers=allocations,
            )
        )
        return "staged" if wrote else "repeated"

    async def on_placement(self, decision: PlacementDecision, delivery: Delivery) -> None:
        """Stage one decision; the bus acks when this returns, naks on TransientError, terms on InvalidInput."""
        fields = {logkeys.POD_UID: decision.pod_uid, logkeys.NODE: self.node}
        if decision.node != self.node:
            raise InvalidInput(f"placement of pod {decision.pod_uid} for node {decision.node} reached {self.node}")
        if self.pods is not None and self.pods.ended(decision.pod_uid):
            self.skipped += 1
            log.info("pod %s/%s is gone: placement not staged", decision.namespace, decision.name, extra=fields)
            return
        with tracer().start_as_current_span(spans.STAGE) as span:
            span.set_attribute(logkeys.POD_UID, decision.pod_uid)
            try:
                outcome = await asyncio.to_thread(self.stage, decision, to_annotation() or "")
            except OSError as err:
                raise TransientError(f"staging pod {decision.pod_uid} failed: {err}", retry_after=2.0) from err
            span.set_attribute("outcome", outcome)
        if outcome == "staged":
            self.staged += 1
        elif outcome == "repeated":
            self.repeated += 1
        else:
            self.skipped += 1
        log.info("placement of pod %s/%s (delivery %d): %s", decision.namespace, decision.name, delivery.deliveries,
                 _OUTCOMES[outcome], extra=fields)  # fmt: skip

    # --- removing entries of pods that are gone -------------------------------------------------------------

    def reconcile(self, gone: Collection[str], live: Collection[str] | None, now_ns: int) -> list[str]:
        """Remove the entries of ``gone`` pods, and with ``live`` (the watch is synced) of staged pods it does
        not know whose bind is older than ``orphan_grace``. Blocking; returns the UIDs removed."""
        removed = [uid for uid in gone if self.store.remove(uid)]
        if live is not None:
            for uid in self.store.staged_uids():
                if uid in live or uid in removed:
                    continue
                entry = self.store.get(uid)
                if (
                    entry is not None
                    and now_ns - entry.bind_time_ns > self.orphan_grace * 1e9
                    and self.store.remove(uid)
                ):
                    removed.append(uid)
        for uid in removed:
            log.info("removed the staged entry of pod %s, which is gone", uid, extra={logkeys.POD_UID: uid})
        return removed

    async def run_reconciler(self) -> None:
        """Reconcile whenever the pod watch sees a pod go, and every ``orphan_grace / 2``, until cancelled."""
        if self.pods is None:
            return
        pods = self.pods
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.orphan_grace / 2):
                    await pods.changed.wait()
            gone = [p.metadata.uid for p in pods.take_gone()]
            live = pods.uids() if pods.synced else None
            try:
                await asyncio.to_thread(self.reconcile, gone, live, self.clock())
            except OSError as err:
                log.warning("removing staged entries failed: %s", err)
