"""Filter (hami-protocol §4.4): choose one node and its cards, reserve them, write HAMi's annotations.

Nodes are visited best-first by the node policy on their cached scores (ties by name, which HAMi leaves
to goroutine timing); a cheap summary rules out nodes that cannot hold the request before the per-card
fit runs, and the first node that fits is the answer (the node HAMi's sort would put last). Only when no
node fits is every node fitted, so each failed node gets HAMi's reason text. The reservation is made
before the patch and undone if the patch fails.

On a node whose allocator is ours (``hami.io/node-placements: bus``) Filter writes nothing: the Binding
carries the annotations (kube-apiserver copies a Binding's annotations onto the pod it binds), so bind is
the pod's one scheduling write. HAMi writes them here, before Bind, and so does Filter where HAMi's device
plugin serves the node, where the pod holds an earlier placement (a Binding can add and replace
annotations, never remove one, and the watch would book the old one back meanwhile), and where the pod has
no labels: a Binding carries no labels, so the allocator adds HAMi's ``hami.io/vgpu-node`` label with its
acknowledgement, and only a pod that has a labels map can get one key added without a condition on the
whole pod (which the kubelet's status writes would keep failing). The reservation is
then in the leader's memory only until the bind: a restarted or new leader does not know it, refuses the
bind ("filter it first"), and kube-scheduler filters the pod again.

A pod may ask for the configured device families too (:mod:`.families`): their requests go to their own
Fit, their node bonus is added to the score, and each used family's annotations join the one patch.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import ChainMap, Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from hami_common import logkeys, spans
from hami_common.annotations import (
    DEVICES_ALLOCATED,
    GRANT_SIGNATURE,
    MIG_ALLOCATIONS,
    TRACE_CONTEXT,
    VGPU_NODE,
    VGPU_TIME,
    encode_mig_allocations,
    encode_unix_seconds,
)
from hami_common.errors import HamiError, InvalidInput, TransientError
from hami_common.events import FilterRefusal, RefusalReason
from hami_common.grants import GrantKey, family_lists
from hami_common.kube import ObjectMeta, ObjectReference, Pod, PodPatcher, reference_to
from hami_common.resources import PodRequest, ResourceConfig
from hami_common.scheduling import (
    NodeFit,
    NodePolicy,
    NodeUsage,
    PodFamilies,
    PodPreferences,
    Reason,
    SchedulerDefaults,
    apply_charges,
    choose_node,
    device_usage_from,
    fit_node,
    preferences_from_annotations,
)
from hami_common.tracing import context_from_annotation, tracer
from hami_extender.families import Families
from hami_extender.ledger import Booking, Ledger, NodeView
from hami_extender.nominations import Nominations
from hami_extender.notices import FILTERING_FAILED, FILTERING_SUCCEED, NoticeQueue
from hami_extender.sync import registration_from
from hami_extender.timings import FilterTimes
from hami_extender.wire import FilterArgs, FilterResult, RawNodeList

__all__ = ["Filtered", "Placer", "refusal_of", "request_of"]

log = logging.getLogger(__name__)


_NO_FAMILIES = Families()


def request_of(pod: Pod, config: ResourceConfig, families: Families = _NO_FAMILIES) -> PodRequest:
    return families.request_of(pod, config)


def refusal_of(pod: Pod, failed: Sequence[NodeFit], offered: int, at_ns: int) -> FilterRefusal:
    """The Filter's reasons for a pod no node fits, counted per reason over the nodes, most frequent first."""
    counts: Counter[str] = Counter()
    for fit in failed:
        counts.update(str(why) for why in fit.rejected)
    meta = pod.metadata
    return FilterRefusal(
        pod_uid=meta.uid,
        namespace=meta.namespace,
        name=meta.name,
        nodes=offered,
        reasons=tuple(RefusalReason(reason=r, nodes=n) for r, n in sorted(counts.items(), key=lambda i: (-i[1], i[0]))),
        at_ns=at_ns,
    )


@dataclass(frozen=True, slots=True)
class Filtered:
    """Filter's answer, and how long it waited on the apiserver (reported as ``Server-Timing``)."""

    result: FilterResult
    apiserver_s: float = 0.0


@dataclass(frozen=True, slots=True)
class _Choice:
    """The node Filter chose (None: none fits), and what it learnt of the others on the way.

    ``failed`` holds the nodes with a reason: the unregistered ones and every node fitted without success
    (all of them when none fits). On success the walk stops at the chosen node: ``ruled_out`` nodes before it
    were refused by the cheap pre-check without a reason, and the nodes ranked after it were not tried."""

    chosen: NodeFit | None
    failed: list[NodeFit]
    ruled_out: int = 0


def _success_message(chosen: NodeFit, choice: _Choice, given: int) -> str:
    """HAMi's ``FilteringSucceed`` text, counting every node kube-scheduler passed (hami-protocol §4.4 step 10).

    HAMi scores every node and lists each that fits; the walk here stops at the best one, so the nodes ranked
    below it are counted as not tried rather than guessed at: the counts add up to the nodes given."""
    not_fit = len(choice.failed) + choice.ruled_out
    untried = max(given - not_fit - 1, 0)
    text = f"find fit node({chosen.node}), {not_fit} nodes not fit, 1 nodes fit({chosen.node}:{chosen.score:.2f})"
    return f"{text}, {untried} nodes not tried" if untried else text


@dataclass(eq=False)
class Placer:
    ledger: Ledger
    pods: PodPatcher
    notices: NoticeQueue
    clock: Callable[[], datetime]
    defaults: SchedulerDefaults = field(default_factory=SchedulerDefaults)
    resources: ResourceConfig = field(default_factory=ResourceConfig)
    patch_timeout: float = 10.0
    filter_times: FilterTimes = field(default_factory=FilterTimes)  # read by Bind, for the placement decision
    grant_key: GrantKey | None = None  # signs each grant, so allocators can tell it from a forged one
    nominations: Nominations | None = None  # preemptors kube-scheduler nominated: their nodes are kept for them
    families: Families = field(default_factory=Families)  # every device family, the primary first
    bus_node: Callable[[str], bool] = field(default=lambda node: False)  # the node's allocator is ours
    refusals: Callable[[FilterRefusal], None] | None = None  # told of each pod no node fits (never waited for)

    def _preferences(self, pod: Pod) -> PodPreferences:
        try:
            return preferences_from_annotations(pod.metadata.annotations, pod.metadata.namespace, self.defaults)
        except InvalidInput as err:
            raise InvalidInput(f"calcScore failed {err} for pod {pod.metadata.name}") from err

    async def filter(self, args: FilterArgs) -> Filtered:
        pod = args.pod
        assert pod is not None  # the codec refuses args without a pod
        request = request_of(pod, self.resources, self.families)
        if not request.has_devices:
            return Filtered(FilterResult(node_names=args.node_names))
        prefs = self._preferences(pod)
        plan = self.families.plan(request, pod.metadata.annotations, prefs)
        if args.nodes is not None:
            return Filtered(self._simulate(args, request, prefs, plan))
        with tracer().start_as_current_span(
            spans.FILTER, context=context_from_annotation(pod.metadata.annotations.get(TRACE_CONTEXT))
        ) as span:
            span.set_attribute(logkeys.POD_UID, pod.metadata.uid)
            return await self._place(pod, args.node_names or [], args.wanted, request, prefs, plan)

    # --- the node-cache path -------------------------------------------------------------------------------

    def _fit(self, view: NodeView, request: PodRequest, prefs: PodPreferences, pod: Pod, plan: PodFamilies) -> NodeFit:
        usage = view.usage
        score: float | None = view.score
        if self.nominations is not None:
            # what a preemption freed here belongs to the pods nominated to it first (see .nominations)
            for nominee in self.nominations.ahead_of(usage.name, pod.metadata.uid, pod.spec.priority):
                held = fit_node(
                    usage,
                    nominee.request,
                    nominee.prefs,
                    memory_factor=self.defaults.memory_factor,
                    families=nominee.families,
                )
                if not held.fits:
                    return NodeFit(node=usage.name, rejected={Reason.NODE_NOMINATED_FOR_OTHER_POD: 1})
                usage, score = apply_charges(usage, held.charges), None
        return fit_node(
            usage,
            request,
            prefs,
            quota=self.ledger.quota(prefs.namespace),
            memory_factor=self.defaults.memory_factor,
            score=score,
            families=plan,
            quotas=self.ledger.family_quotas(prefs.namespace) if request.families else None,
        )

    def _choose(
        self,
        pod: Pod,
        names: Sequence[str],
        wanted: frozenset[str],
        request: PodRequest,
        prefs: PodPreferences,
        plan: PodFamilies,
    ) -> _Choice:
        spread = prefs.node_policy is NodePolicy.SPREAD
        ordered, missing = self.ledger.candidates(names, spread, wanted or None)
        failed = [NodeFit(node=name, rejected={Reason.NODE_UNREGISTERED: 1}) for name in missing]
        checks = [(r.nums, r.memreq, r.coresreq) for r in request.containers if r is not None]
        skipped: list[NodeView] = []
        for view in ordered:
            if not all(view.may_fit(*check) for check in checks):
                skipped.append(view)
                continue
            fit = self._fit(view, request, prefs, pod, plan)
            if fit.fits:
                return _Choice(fit, failed, ruled_out=len(skipped))
            failed.append(fit)
        failed.extend(self._fit(view, request, prefs, pod, plan) for view in skipped)
        return _Choice(None, failed)

    async def _place(
        self,
        pod: Pod,
        names: Sequence[str],
        wanted: frozenset[str],
        request: PodRequest,
        prefs: PodPreferences,
        plan: PodFamilies,
    ) -> Filtered:
        meta = pod.metadata
        self.ledger.release(meta.uid)  # filtered again: the earlier reservation no longer holds
        choice = self._choose(pod, names, wanted, request, prefs, plan)
        chosen, failed = choice.chosen, choice.failed
        ref = reference_to(pod, "Pod")
        if chosen is None:
            self._report_failure(ref, failed)
            if self.refusals is not None:
                self.refusals(refusal_of(pod, failed, len(wanted or set(names)), time.time_ns()))
            return Filtered(FilterResult(failed_nodes=_sorted_reasons(failed)))
        booking = Booking(
            uid=meta.uid,
            namespace=meta.namespace,
            name=meta.name,
            node=chosen.node,
            grants=chosen.grants,
            init_count=chosen.init_count,
            charges=chosen.charges,
            mig=chosen.mig,
        )
        self.ledger.book(booking)  # reserve before the patch: a concurrent Filter sees these cards taken
        by_family = self.families.split(chosen.grants)
        changes: dict[str, str | None] = {
            VGPU_NODE: chosen.node,
            VGPU_TIME: encode_unix_seconds(self.clock()),
        }
        # HAMi writes a family's lists only when the pod got its devices: an earlier placement's go
        changes.update(dict.fromkeys(self.families.stale(by_family, meta.annotations)))
        view = self.ledger.view(chosen.node)
        usage = view.usage if view is not None else NodeUsage(name=chosen.node, devices=())
        written = {k: v for k, v in changes.items() if v is not None}
        # a view, not a copy: most families read none of the pod's annotations
        signed = self.families.pod_annotations(usage, by_family, ChainMap(written, meta.annotations))
        changes.update(signed)
        if chosen.mig:
            changes[MIG_ALLOCATIONS] = encode_mig_allocations(chosen.mig)
        elif MIG_ALLOCATIONS in meta.annotations:
            changes[MIG_ALLOCATIONS] = None  # an earlier Filter's reservations, on another node or card
        if self.grant_key is not None:
            changes[GRANT_SIGNATURE] = self.grant_key.sign(
                meta.uid, chosen.node, signed.get(DEVICES_ALLOCATED, ""), chosen.mig, family_lists(signed)
            )
        started = time.perf_counter()
        try:
            placement = _deferrable(changes, meta) if self.bus_node(chosen.node) else None
            if placement is not None:
                self.ledger.defer_placement(meta.uid, placement)
            else:
                async with asyncio.timeout(self.patch_timeout):
                    await self.pods.patch_pod_annotations(meta.namespace, meta.name, changes)
        except (HamiError, TimeoutError) as err:
            self.ledger.release(meta.uid)
            log.warning(
                "filter: patch of pod %s/%s failed, reservation undone: %s",
                meta.namespace,
                meta.name,
                err,
                extra={logkeys.POD_UID: meta.uid},
            )
            if isinstance(err, TimeoutError):
                raise TransientError(f"patch of pod {meta.namespace}/{meta.name} timed out") from err
            raise
        self.notices.emit(ref, "Normal", FILTERING_SUCCEED, _success_message(chosen, choice, len(wanted or set(names))))
        # Logged once the answer is on its way: the write gives up the GIL, and getting it back from a busy
        # worker thread (a kube call, an event) can take a switch interval that /filter would wait out.
        asyncio.get_running_loop().call_soon(
            functools.partial(
                log.info,
                "filter: pod %s/%s -> %s %s",
                meta.namespace,
                meta.name,
                chosen.node,
                signed.get(DEVICES_ALLOCATED, ""),
                extra={logkeys.POD_UID: meta.uid, logkeys.NODE: chosen.node},
            )
        )
        # Success carries "FailedNodes":null, as HAMi's does: the losers are in the FilteringSucceed event (when on).
        return Filtered(FilterResult(node_names=[chosen.node]), time.perf_counter() - started)

    def _report_failure(self, ref: ObjectReference, failed: Sequence[NodeFit]) -> None:
        self.notices.emit(ref, "Warning", FILTERING_FAILED, f"no available node, {len(failed)} nodes do not meet")
        by_reason: dict[str, list[str]] = defaultdict(list)
        for fit in failed:
            for why in fit.rejected:
                by_reason[str(why)].append(fit.node)
        for text, nodes in sorted(by_reason.items()):
            self.notices.emit(ref, "Warning", FILTERING_FAILED, f"{len(nodes)} nodes {text}({','.join(nodes)})")

    # --- the dry-run path (hami-protocol §7.4): full nodes, no usage, no side effects ----------------------

    def _simulate(
        self, args: FilterArgs, request: PodRequest, prefs: PodPreferences, plan: PodFamilies
    ) -> FilterResult:
        assert args.nodes is not None
        fits: list[NodeFit] = []
        raw_by_name = {}
        for node, raw in zip(args.node_objects, args.nodes.items, strict=False):
            name = node.metadata.name
            raw_by_name[name] = raw
            try:
                registration = registration_from(node)
            except HamiError:
                registration = None
            if registration is None:
                fits.append(NodeFit(node=name, rejected={Reason.NODE_UNREGISTERED: 1}))
                continue
            usage = NodeUsage(
                name=name,
                devices=tuple(device_usage_from(d, self.ledger.mig_allowlist) for d in registration.devices),
                pair_scores=registration.pair_scores,
                cordoned=registration.cordoned,
            )
            fits.append(fit_node(usage, request, prefs, memory_factor=self.defaults.memory_factor, families=plan))
        chosen = choose_node(fits, prefs.node_policy)
        items = [raw_by_name[chosen.node]] if chosen is not None else []
        return FilterResult(nodes=RawNodeList(items=items), failed_nodes=_sorted_reasons(f for f in fits if not f.fits))


def _deferrable(changes: Mapping[str, str | None], meta: ObjectMeta) -> dict[str, str] | None:
    """The placement as a Binding's annotations, or None where Filter must patch it: a key to remove, an
    earlier placement on the pod, or a pod without labels (see the module's docstring)."""
    if VGPU_NODE in meta.annotations or not meta.labels:
        return None
    written = {k: v for k, v in changes.items() if v is not None}
    return written if len(written) == len(changes) else None


def _sorted_reasons(failed: Iterable[NodeFit]) -> dict[str, str]:
    """Node -> reason in key order: Go's encoding/json writes every map sorted, so HAMi's answer is too."""
    return dict(sorted((fit.node, fit.reason) for fit in failed))
