"""Preempt (k8s-interfaces §2.1): for each node kube-scheduler offers, the victims that free GPU slices.

kube-scheduler computes its own victims from the resources it sees, then asks the extender, which may answer
with other victims or drop nodes. GPU memory and cores are ``ignoredByScheduler``, so its proposal means
nothing for them: this adapter reads the node's bookings from the ledger and each booking's pod (priority,
labels) from the watch cache, marks the pods a PodDisruptionBudget protects, and lets the placement engine
(:func:`hami_common.scheduling.choose_victims`) choose. Nodes where no set works are left out.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from hami_common import logkeys
from hami_common.errors import InvalidInput
from hami_common.kube import Pod
from hami_common.resources import PodRequest, ResourceConfig
from hami_common.scheduling import (
    Candidate,
    DeviceCharge,
    SchedulerDefaults,
    choose_victims,
    preferences_from_annotations,
)
from hami_extender.families import Families
from hami_extender.ledger import Ledger
from hami_extender.placer import request_of
from hami_extender.wire import MetaPod, MetaVictims, PreemptionArgs, PreemptionResult

__all__ = ["Budget", "LabelSelector", "Preemptor", "protected"]

log = logging.getLogger(__name__)

_HAMI_LOW_PRIORITY = 1


class _Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pass


class Requirement(_Wire, frozen=True):
    key: str
    operator: str
    values: tuple[str, ...] = ()


class LabelSelector(_Wire, frozen=True):
    match_labels: dict[str, str] = msgspec.field(default_factory=dict)
    match_expressions: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for req in self.match_expressions:
            present, value = req.key in labels, labels.get(req.key)
            ok = {
                "In": present and value in req.values,
                "NotIn": not present or value not in req.values,
                "Exists": present,
                "DoesNotExist": not present,
            }.get(req.operator, False)
            if not ok:
                return False
        return True


class _BudgetSpec(_Wire, frozen=True):
    selector: LabelSelector | None = None


class _BudgetStatus(_Wire, frozen=True):
    disruptions_allowed: int = 0
    disrupted_pods: dict[str, str] = msgspec.field(default_factory=dict)


class _BudgetMeta(_Wire, frozen=True):
    name: str = ""
    namespace: str = ""


class Budget(_Wire, frozen=True):
    """A ``policy/v1`` PodDisruptionBudget, as far as preemption reads it."""

    metadata: _BudgetMeta = msgspec.field(default_factory=_BudgetMeta)
    spec: _BudgetSpec = msgspec.field(default_factory=_BudgetSpec)
    status: _BudgetStatus = msgspec.field(default_factory=_BudgetStatus)


def protected(pod: Pod, budgets: Sequence[Budget]) -> bool:
    """Evicting ``pod`` would break a budget: one of its namespace selects it and allows no disruption
    (kube-scheduler's test, pod by pod; a pod the budget already counts as disrupted breaks nothing)."""
    meta = pod.metadata
    for budget in budgets:
        selector = budget.spec.selector
        if budget.metadata.namespace != meta.namespace or selector is None or selector.empty:
            continue
        if not selector.matches(meta.labels) or meta.name in budget.status.disrupted_pods:
            continue
        if budget.status.disruptions_allowed <= 0:
            return True
    return False


def _gpu_priority(pod: Pod, config: ResourceConfig) -> int:
    """HAMi's ``nvidia.com/priority`` of the pod: its most important container's (0 high, 1 low)."""
    try:
        request: PodRequest = request_of(pod, config)
    except InvalidInput:  # a victim bound by another scheduler with a quantity we cannot read: the least important
        return _HAMI_LOW_PRIORITY
    values = [c.priority for c in request.containers if c is not None and c.priority is not None]
    return min(values, default=_HAMI_LOW_PRIORITY)


@dataclass(eq=False)
class Preemptor:
    ledger: Ledger
    cached_pod: Callable[[str, str], Pod | None]
    budgets: Callable[[], Awaitable[list[Budget]]]  # every PodDisruptionBudget, read when a choice needs them
    defaults: SchedulerDefaults = field(default_factory=SchedulerDefaults)
    resources: ResourceConfig = field(default_factory=ResourceConfig)
    families: Families = field(default_factory=Families)  # every device family, the primary first

    async def preempt(self, args: PreemptionArgs) -> PreemptionResult:
        pod = args.pod
        meta = pod.metadata
        request = request_of(pod, self.resources, self.families)
        if not request.has_devices:
            return PreemptionResult(node_name_to_meta_victims={})
        try:
            prefs = preferences_from_annotations(meta.annotations, meta.namespace, self.defaults)
        except InvalidInput as err:
            raise InvalidInput(f"preempt: {err} for pod {meta.name}") from err
        plan = self.families.plan(request, meta.annotations, prefs)
        quotas = self.ledger.family_quotas(meta.namespace) if request.families else None
        victims_by_node = {node: self._victims(node, pod) for node in args.nodes}
        budgets = await self.budgets() if any(victims_by_node.values()) else []
        chosen: dict[str, MetaVictims] = {}
        for node, pods in victims_by_node.items():
            view = self.ledger.view(node)
            if view is None or not pods:
                continue
            candidates = [
                Candidate(
                    uid=victim.metadata.uid,
                    priority=victim.spec.priority,
                    charges=charges,
                    gpu_priority=_gpu_priority(victim, self.resources),
                    violates_pdb=protected(victim, budgets),
                )
                for victim, charges in pods
            ]
            choice = choose_victims(
                view.usage,
                request,
                prefs,
                candidates,
                preemptor_priority=pod.spec.priority,
                quota=self.ledger.quota(meta.namespace),
                memory_factor=self.defaults.memory_factor,
                families=plan,
                quotas=quotas,
            )
            if choice is not None:
                chosen[node] = MetaVictims(
                    pods=[MetaPod(uid=v.uid) for v in choice.victims], num_pdb_violations=choice.pdb_violations
                )
        log.info(
            "preempt: pod %s/%s (priority %d) -> %s",
            meta.namespace,
            meta.name,
            pod.spec.priority,
            {n: [p.uid for p in v.pods] for n, v in chosen.items()} or "no candidate node",
            extra={logkeys.POD_UID: meta.uid},
        )
        return PreemptionResult(node_name_to_meta_victims=chosen)

    def _victims(self, node: str, preemptor: Pod) -> list[tuple[Pod, tuple[DeviceCharge, ...]]]:
        """The pods holding GPUs on ``node`` that could be victims: lower priority, not already leaving."""
        out: list[tuple[Pod, tuple[DeviceCharge, ...]]] = []
        for booking in self.ledger.bookings_on(node):
            if booking.uid == preemptor.metadata.uid:
                continue
            victim = self.cached_pod(booking.namespace, booking.name)
            if victim is None or victim.metadata.uid != booking.uid or victim.metadata.deletion_timestamp:
                continue
            if victim.spec.priority < preemptor.spec.priority:
                out.append((victim, booking.charges))
        return out
