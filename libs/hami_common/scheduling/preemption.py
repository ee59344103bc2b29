"""Which pods to preempt on a node so that a more important GPU pod fits there (the extender's preempt verb).

kube-scheduler cannot see GPU slices (they are ``ignoredByScheduler``), so it asks the extender. This module
answers for one node, purely: given the node's usage with every booking applied, the preemptor's request and
the bookings that could be given up, it returns the smallest set of victims whose charges, once freed, let the
preemptor fit under the same Fit rules and policies as Filter, or None when no set does.

Rules, as kube-scheduler's DefaultPreemption applies them to its own resources:

* only pods of a strictly lower PriorityClass value may be victims: equal priority is never preempted;
* fewer victims first; among sets of one size, the one violating fewest PodDisruptionBudgets, then the one
  whose most important victim is least important, then the least important in sum. Importance is the
  PriorityClass value, then HAMi's ``nvidia.com/priority`` within one class (0 is high, 1 low);
* a node where the preemptor already fits is no candidate (kube-scheduler refuses a candidate without
  victims), nor is one where it does not fit even with every eligible victim gone.

The search is exhaustive up to :data:`EXHAUSTIVE_LIMIT` eligible bookings (at most 2^limit fits); beyond it,
kube-scheduler's own reprieve (remove all, then add back the most important victims while the preemptor
still fits) gives a minimal, if not always smallest, set.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from hami_common.resources import PodRequest
from hami_common.scheduling.placement import NodeFit, PodFamilies, fit_node
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.quota import NamespaceQuota
from hami_common.scheduling.usage import DeviceCharge, NodeUsage, apply_charges

__all__ = ["EXHAUSTIVE_LIMIT", "Candidate", "VictimChoice", "choose_victims"]

EXHAUSTIVE_LIMIT: Final = 10
_HAMI_LOW_PRIORITY: Final = 1  # a container without nvidia.com/priority is HAMi's low priority


@dataclass(frozen=True, slots=True)
class Candidate:
    """A booking on the node that could be given up: its pod's importance and what it holds."""

    uid: str
    priority: int  # the pod's PriorityClass value (spec.priority)
    charges: tuple[DeviceCharge, ...]
    gpu_priority: int = _HAMI_LOW_PRIORITY  # HAMi's nvidia.com/priority: 0 high, 1 low
    violates_pdb: bool = False  # evicting it would break a PodDisruptionBudget

    @property
    def importance(self) -> tuple[int, int]:
        return (self.priority, -self.gpu_priority)


@dataclass(frozen=True, slots=True)
class VictimChoice:
    """The victims (in the order given), how many PDBs they violate, and the preemptor's fit once they go."""

    victims: tuple[Candidate, ...]
    fit: NodeFit

    @property
    def pdb_violations(self) -> int:
        return sum(1 for v in self.victims if v.violates_pdb)


def _key(victims: Sequence[Candidate]) -> tuple[int, tuple[int, int], tuple[int, int]]:
    most = max(v.importance for v in victims)
    total = (sum(v.priority for v in victims), -sum(v.gpu_priority for v in victims))
    return (sum(1 for v in victims if v.violates_pdb), most, total)


def choose_victims(
    node: NodeUsage,
    request: PodRequest,
    prefs: PodPreferences,
    candidates: Sequence[Candidate],
    *,
    preemptor_priority: int,
    quota: NamespaceQuota | None = None,
    memory_factor: int = 1,
    families: PodFamilies | None = None,
    quotas: Mapping[str, NamespaceQuota] | None = None,
) -> VictimChoice | None:
    """The smallest victim set on ``node`` that lets the preemptor fit, or None (see the module)."""

    def fit_without(victims: Sequence[Candidate]) -> NodeFit:
        usage = node
        for victim in victims:
            usage = apply_charges(usage, victim.charges, -1)
        # the quota as it stands: kube-scheduler does not reason about quotas when it preempts either
        return fit_node(
            usage, request, prefs, quota=quota, memory_factor=memory_factor, families=families, quotas=quotas
        )

    eligible = [c for c in candidates if c.priority < preemptor_priority and c.charges]
    if not eligible or fit_without(()).fits or not fit_without(eligible).fits:
        return None
    if len(eligible) <= EXHAUSTIVE_LIMIT:
        return _smallest(eligible, fit_without)
    return _reprieve(eligible, fit_without)


def _smallest(eligible: list[Candidate], fit_without: Callable[[Sequence[Candidate]], NodeFit]) -> VictimChoice:
    for size in range(1, len(eligible) + 1):
        best: VictimChoice | None = None
        for victims in itertools.combinations(eligible, size):
            if best is not None and _key(victims) >= _key(best.victims):
                continue
            fit = fit_without(victims)
            if fit.fits:
                best = VictimChoice(victims=victims, fit=fit)
        if best is not None:
            return best
    raise AssertionError("unreachable: every eligible victim gone was checked to fit")


def _reprieve(eligible: list[Candidate], fit_without: Callable[[Sequence[Candidate]], NodeFit]) -> VictimChoice:
    """kube-scheduler's way: PDB-violating victims are reprieved first, the most important first."""
    order = sorted(eligible, key=lambda c: (not c.violates_pdb, tuple(-x for x in c.importance)))
    victims = list(eligible)
    for candidate in order:
        trial = [v for v in victims if v is not candidate]
        if fit_without(trial).fits:
            victims = trial
    return VictimChoice(victims=tuple(victims), fit=fit_without(victims))
