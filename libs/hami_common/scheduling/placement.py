"""Fitting a whole pod to a node and choosing among nodes (hami-protocol §4.4-4.5, HAMi's calcScore).

Init containers are fitted independently against the node as it is (they run one at a time); app
containers are fitted in order against one shared copy, so their usage accumulates. A container may ask
several device families (NVIDIA's request first, then each family's): each request goes to its family's
Fit and the container's cards are the union. The node's score is its usage *before* the pod, plus each
family's own node bonus for the cards picked (HAMi adds Ascend 910's grouping score raw). Among fitting
nodes the node policy picks: binpack the highest score, spread the lowest; ties go to the node listed
last, as HAMi takes the last element of its sorted list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

import msgspec

from hami_common.annotations.devices import ContainerDevice, ContainerDevices, PodDevices
from hami_common.annotations.mig import MigAllocation
from hami_common.annotations.registration import MODE_MIG
from hami_common.resources import DeviceRequest, PodRequest
from hami_common.scheduling.mig import BookedInstance
from hami_common.scheduling.nvidia import NVIDIA
from hami_common.scheduling.policy import NodePolicy, PodPreferences
from hami_common.scheduling.quota import NamespaceQuota
from hami_common.scheduling.reason import Reason, render_reasons
from hami_common.scheduling.score import device_score, node_score, sort_devices
from hami_common.scheduling.usage import DeviceCharge, DeviceUsage, NodeUsage, collapse_devices
from hami_common.scheduling.vendor import ContainerFit, FitContext, Vendor

__all__ = [
    "DEFAULT_VENDORS",
    "NodeFit",
    "NodeScorer",
    "PodFamilies",
    "choose_node",
    "fit_container",
    "fit_node",
    "preference",
    "unregistered",
]

DEFAULT_VENDORS: Final[Mapping[str, Vendor]] = {NVIDIA.word: NVIDIA}


class NodeScorer(Protocol):
    """A family's node bonus for the cards a pod was given (HAMi's per-vendor ``ScoreNode``)."""

    @property
    def word(self) -> str: ...

    def score_node(self, node: NodeUsage, picked: Sequence[Sequence[ContainerDevice]]) -> float: ...


@dataclass(frozen=True, slots=True)
class PodFamilies:
    """What one pod's fit consults beyond its base preferences, worked out once per pod.

    ``vendors``: every Fit by common word (NVIDIA's and the configured families'); ``prefs``: the pod's
    preferences per family word, read from that family's own use/nouse annotations (a word not listed uses
    the pod's base preferences, as NVIDIA does); ``scorers``: the families the pod asks whose node bonus
    counts."""

    vendors: Mapping[str, Vendor] = field(default_factory=lambda: DEFAULT_VENDORS)
    prefs: Mapping[str, PodPreferences] = field(default_factory=dict)
    scorers: tuple[NodeScorer, ...] = ()


_NVIDIA_ONLY: Final = PodFamilies()


@dataclass(frozen=True, slots=True)
class NodeFit:
    """One node's verdict for one pod: the cards per container (init first), or why not."""

    node: str
    score: float = 0.0
    grants: PodDevices = ()
    init_count: int = 0
    mig: tuple[MigAllocation, ...] = ()  # the MIG instances among ``grants`` (hami.io/vgpu-mig-allocations)
    rejected: Mapping[Reason, int] = field(default_factory=dict)
    checked: int = 0
    unresolvable: bool = False

    @property
    def fits(self) -> bool:
        return not self.rejected and not self.unresolvable

    @property
    def reason(self) -> str:
        """HAMi's text for ``FailedNodes``: ``"1/2 CardInsufficientMemory, …"`` or a bare node reason."""
        return render_reasons(self.rejected, self.checked)

    @property
    def charges(self) -> tuple[DeviceCharge, ...]:
        """What the pod books on the node, init containers collapsed against app containers (§4.9)."""
        return collapse_devices(self.grants[: self.init_count], self.grants[self.init_count :], self.mig)


def unregistered(node: str) -> NodeFit:
    return NodeFit(node=node, rejected={Reason.NODE_UNREGISTERED: 1}, unresolvable=True)


def fit_container(
    devices: Sequence[DeviceUsage],
    request: DeviceRequest,
    ctx: FitContext,
    vendors: Mapping[str, Vendor] = DEFAULT_VENDORS,
) -> ContainerFit:
    """HAMi's ``fitInDevices`` for one container: score, sort, keep the vendor's cards, Fit."""
    vendor = vendors.get(request.type)
    if vendor is None:
        return ContainerFit(rejected={Reason.DEVICE_TYPE_NOT_FOUND: 1})
    weights = ctx.prefs.weights
    # HAMi scores and sorts every card of the node, then each vendor's Fit skips the others; the sort is
    # stable and keyed per card, so scoring only the vendor's own cards gives them the same order for less
    own = sort_devices([(d, device_score(d, (request,), weights)) for d in devices if vendor.owns(d)], ctx.prefs)
    if request.nums > len(own) and not _may_cut(own, ctx):
        return ContainerFit(rejected={Reason.NODE_INSUFFICIENT_DEVICE: 1}, checked=len(own))
    return vendor.fit(own, request, ctx)


def _may_cut(devices: Sequence[DeviceUsage], ctx: FitContext) -> bool:
    """HAMi's ``isMIGRequest``: a MIG card may hold several of the container's instances, so more cards than
    the node has may be asked for, unless the pod's ``nvidia.com/vgpu-mode`` rules MIG out."""
    mode = ctx.prefs.vgpu_mode
    return (mode is None or MODE_MIG in mode) and any(d.is_mig for d in devices)


def _granted(devices: list[DeviceUsage], fit: ContainerFit, instances_only: bool = False) -> None:
    """Book the container's grants on ``devices``; ``instances_only``: its MIG slices alone."""
    position = {d.id: i for i, d in enumerate(devices)}
    instance_at = {m.device_index: BookedInstance(profile=m.profile, placement=m.placement) for m in fit.mig}
    for n, g in enumerate(fit.devices):
        i = position[g.uuid]
        instance = instance_at.get(n)
        if instances_only:
            if instance is not None:
                devices[i] = devices[i].with_instances((instance,))
        else:
            devices[i] = devices[i].with_grant(g.usedmem, g.usedcores, instance=instance)


def fit_node(
    node: NodeUsage,
    request: PodRequest,
    prefs: PodPreferences,
    *,
    quota: NamespaceQuota | None = None,
    memory_factor: int = 1,
    score: float | None = None,
    vendors: Mapping[str, Vendor] = DEFAULT_VENDORS,
    families: PodFamilies | None = None,
    quotas: Mapping[str, NamespaceQuota] | None = None,
) -> NodeFit:
    """HAMi's per-node ``calcScore``; ``score`` may pass the node's score when the caller has it cached.

    ``quota`` is NVIDIA's namespace quota; ``quotas`` a family's, by its common word (Cambricon's Fit checks
    it; the others have no quota step). ``families`` (see :class:`PodFamilies`) replaces ``vendors``.
    """
    plan = families if families is not None else (_NVIDIA_ONLY if vendors is DEFAULT_VENDORS else PodFamilies(vendors))
    grants: list[ContainerDevices] = []
    mig: list[MigAllocation] = []
    init_count = len(request.init)
    mixed = bool(request.families)

    def rejected(fit: ContainerFit) -> NodeFit:
        return NodeFit(node=node.name, rejected=fit.rejected, checked=fit.checked)

    def context(req: DeviceRequest, index: int) -> FitContext:
        prior_init = tuple(grants[:init_count])
        prior_app = tuple(grants[init_count:])
        own_quota = quota
        if mixed:
            # a family's quota counts its own cards only: keep the others' out of the pod's running total
            prior_init = tuple(tuple(g for g in c if g.type == req.type) for c in prior_init)
            prior_app = tuple(tuple(g for g in c if g.type == req.type) for c in prior_app)
        if req.type != NVIDIA.word:
            own_quota = quotas.get(req.type) if quotas else None
        return FitContext(
            prefs=plan.prefs.get(req.type, prefs),
            node=node,
            quota=own_quota,
            memory_factor=memory_factor,
            prior_init=prior_init,
            prior_app=prior_app,
            fitting_init=index < init_count,
        )

    # Init containers run one at a time, so each is fitted against the node as it is; only their MIG
    # instances accumulate: an instance outlives its container (it is destroyed with the pod), so no later
    # container may be placed over it. HAMi fits them against the node as it was, and may overlap the two.
    current = list(node.devices)
    for index in range(len(request.init) + len(request.app)):
        is_init = index < init_count
        picked: tuple[ContainerDevice, ...] = ()
        for req in request.requests(index):
            fit = fit_container(current, req, context(req, index), plan.vendors)
            if not fit.fits:
                return rejected(fit)
            # MIG instances index the container's cards: NVIDIA's request comes first, so they stay right
            mig.extend(msgspec.structs.replace(m, container_index=index) for m in fit.mig)
            picked = (*picked, *fit.devices)
            _granted(current, fit, instances_only=is_init)
        grants.append(picked)
    total = node_score(node.devices) if score is None else score
    for scorer in plan.scorers:
        word = scorer.word
        own = [tuple(g for g in c if g.type == word) for c in grants]
        if any(own):
            total += scorer.score_node(node, own)
    return NodeFit(
        node=node.name,
        score=total,
        grants=tuple(grants),
        init_count=init_count,
        mig=tuple(mig),
    )


def preference(score: float, policy: NodePolicy) -> float:
    """Larger is better: binpack prefers the most used node, spread the least used."""
    return score if policy is NodePolicy.BINPACK else -score


def choose_node(fits: Sequence[NodeFit], policy: NodePolicy) -> NodeFit | None:
    """The fitting node the policy prefers; ties go to the one listed last (HAMi takes the tail)."""
    best: NodeFit | None = None
    for fit in fits:
        if fit.fits and (best is None or preference(fit.score, policy) >= preference(best.score, policy)):
            best = fit
    return best
