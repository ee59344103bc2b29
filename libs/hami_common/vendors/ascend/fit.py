"""Ascend's Fit and node score (hami-vendors §1.6) around the common walk of :mod:`hami_common.vendors._common`.

Around the walk of §0.2 Ascend adds:

* **the mode gate**: a ``hami-core`` pod on a node that does not run hami-vnpu-core fails at once with
  ``1/<n> ModeNotFit``. The node's mode is read at registration time into ``DeviceUsage.mode``
  (:meth:`hami_common.vendors.ascend.family.AscendFamily.node_devices`), so the fit needs no Node object;
* **the effective total core**: 100 for a hami-core pod, the registered ``devcore`` otherwise;
* **exact type matching**: HAMi selects cards whose type *contains* the request type (case-insensitive), so
  an ``Ascend910B4`` pod can land on ``Ascend910B4-1`` NPUs. We keep that selection for ownership but refuse
  any card whose type is not exactly the common word (``CardTypeMismatch``);
* **topology mode** for ``Ascend910*`` when every card has a NetworkID: every passing card is collected, and
  a multi-NPU request fills from the HCCS group with the most free cards (HAMi's ``computeBestCombination``).
  HAMi orders equal groups arbitrarily (a Go map); we keep the order in which the walk met them;
* **910C module pairing** for a multi-NPU 910C request, before topology: only cards whose two NPUs
  (registration index ``i // 2``) both passed, whole cards until the request is met; any other count fails
  with ``AllocatedCardsInsufficientRequest`` over a denominator of the request, as HAMi renders it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from hami_common.annotations.devices import ContainerDevice
from hami_common.resources import DeviceRequest
from hami_common.scheduling.reason import Reason
from hami_common.scheduling.usage import DeviceUsage, NodeUsage
from hami_common.scheduling.vendor import ContainerFit, FitContext
from hami_common.vendors._common import FULL_CORES, walk
from hami_common.vendors.ascend.keys import (
    ASCEND_910_PREFIX,
    ASCEND_910C,
    MODE_HAMI_CORE,
    NETWORK_WEIGHT,
    NPUS_PER_910C_MODULE,
)

__all__ = ["fit_npus", "group_by_network", "pair_modules", "score_grouping"]


def group_by_network(
    candidates: Sequence[ContainerDevice], network: dict[str, int | None], nums: int
) -> tuple[ContainerDevice, ...]:
    """Fill ``nums`` from the largest NetworkID group down; within a group, walk order."""
    groups: dict[int, list[ContainerDevice]] = {}
    for cand in candidates:
        net = network.get(cand.uuid)
        if net is not None:
            groups.setdefault(net, []).append(cand)
    chosen: list[ContainerDevice] = []
    for members in sorted(groups.values(), key=len, reverse=True):  # stable: ties keep walk order
        for cand in members:
            chosen.append(cand)
            if len(chosen) == nums:
                return tuple(chosen)
    return tuple(chosen)


def pair_modules(
    candidates: Sequence[ContainerDevice], index: dict[str, int], nums: int
) -> tuple[ContainerDevice, ...]:
    """910C: whole modules (both NPUs passed) until ``nums`` NPUs are taken; a half-free module is never used."""
    modules: dict[int, list[ContainerDevice]] = {}
    for cand in candidates:
        modules.setdefault(index[cand.uuid] // NPUS_PER_910C_MODULE, []).append(cand)
    chosen: list[ContainerDevice] = []
    for members in sorted(modules.values(), key=len, reverse=True):
        if len(chosen) >= nums:
            break
        if len(members) == NPUS_PER_910C_MODULE:
            chosen.extend(members)
    return tuple(chosen)


def fit_npus(word: str, devices: Sequence[DeviceUsage], request: DeviceRequest, ctx: FitContext) -> ContainerFit:
    """One container's Fit on one node's NPUs of model ``word`` (``devices`` in the engine's sorted order)."""
    hami_core_pod = ctx.prefs.vgpu_mode == MODE_HAMI_CORE  # the family's preferences carry vnpu-mode here
    if hami_core_pod and not all(d.mode == MODE_HAMI_CORE for d in devices):
        return ContainerFit(rejected={Reason.MODE_NOT_FIT: 1}, checked=len(devices))
    pairing = word == ASCEND_910C and request.nums > 1
    topology = word.startswith(ASCEND_910_PREFIX) and all(d.network_id is not None for d in devices)
    result = walk(
        devices,
        request,
        ctx,
        word=word,
        type_ok=lambda d: d.type == word,
        total_core=(lambda _: FULL_CORES) if hami_core_pod else (lambda d: d.totalcore),
        collect_all=pairing or topology,
    )
    nums = request.nums
    if pairing:
        chosen = pair_modules(result.candidates, {d.id: d.index for d in devices}, nums)
        if len(chosen) == nums:
            return ContainerFit(devices=chosen, checked=len(devices))
        reasons = Counter(result.rejected)
        # HAMi counts the NPUs it could pair (0 included) out of the request, not out of the cards.
        reasons[Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(chosen)
        return ContainerFit(rejected=dict(reasons), checked=nums)
    if topology and len(result.candidates) > nums > 1:
        network = {d.id: d.network_id for d in devices}
        chosen = group_by_network(result.candidates, network, nums)
        return ContainerFit(devices=chosen, checked=len(devices))
    return result.finish(nums)  # also topology with exactly nums, or nums == 1 (the first, highest sorted)


def score_grouping(node: NodeUsage, picked: Sequence[Sequence[ContainerDevice]]) -> float:
    """HAMi's Ascend 910 ``ScoreNode``: per container, the share of its NPUs in its most common NetworkID,
    summed and × 10; 0 as soon as one NPU has no NetworkID."""
    network = {d.id: d.network_id for d in node.devices}
    score = 0.0
    for devices in picked:
        if not devices:
            continue
        groups: Counter[int] = Counter()
        for dev in devices:
            net = network.get(dev.uuid)
            if net is None:
                return 0.0
            groups[net] += 1
        score += max(groups.values()) / len(devices)
    return score * NETWORK_WEIGHT
