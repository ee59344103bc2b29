"""NVIDIA's per-card Fit, in HAMi's exact check order (hami-protocol §4.7), and topology selection."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from hami_common.annotations.devices import ContainerDevice
from hami_common.annotations.keys import NVIDIA_VENDOR
from hami_common.annotations.mig import MigAllocation
from hami_common.resources import UNSET_PERCENTAGE, DeviceRequest
from hami_common.scheduling.mig import choose_instance, mask, occupied_mask
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.reason import Reason
from hami_common.scheduling.usage import DeviceUsage, NodeUsage
from hami_common.scheduling.vendor import ContainerFit, FitContext

__all__ = ["NVIDIA", "NvidiaVendor", "best_combination", "type_matches", "uuid_matches", "worst_single_card"]

FULL_CORES: Final = 100


def type_matches(dev: DeviceUsage, request: DeviceRequest, prefs: PodPreferences) -> bool:
    """use/nouse-gputype (case-insensitive substrings), vgpu-mode, and the request's vendor word."""
    if request.type != NVIDIA_VENDOR:
        return False
    model = dev.type.lower()
    if prefs.use_types and not any(t.lower() in model for t in prefs.use_types):
        return False
    if any(t.lower() in model for t in prefs.nouse_types):
        return False
    return prefs.vgpu_mode is None or dev.mode in prefs.vgpu_mode


def uuid_matches(dev: DeviceUsage, prefs: PodPreferences) -> bool:
    if prefs.use_uuids and dev.id not in prefs.use_uuids:
        return False
    return dev.id not in prefs.nouse_uuids


def _pair(node: NodeUsage, a: str, b: str) -> int:
    return node.pair_scores.get(a, {}).get(b, 0)


def worst_single_card(node: NodeUsage, candidates: Sequence[ContainerDevice]) -> ContainerDevice:
    """One card asked for: the candidate worst connected to the others (lowest pair-score sum, first wins)."""
    best: ContainerDevice | None = None
    lowest = -1
    for a in candidates:
        total = sum(_pair(node, a.uuid, b.uuid) for b in candidates if b.uuid != a.uuid)
        if lowest == -1 or total < lowest:
            lowest, best = total, a
    assert best is not None  # callers pass at least one candidate
    return best


def best_combination(node: NodeUsage, candidates: Sequence[ContainerDevice], nums: int) -> tuple[ContainerDevice, ...]:
    """Several cards: the size-``nums`` combination, in list order, with the highest pair-score sum."""
    best: tuple[ContainerDevice, ...] = ()
    best_score = -1  # HAMi starts at 0 and so grants nothing when no pair has a score; take the first instead
    for combo in itertools.combinations(candidates, nums):
        total = sum(_pair(node, a.uuid, b.uuid) for a, b in itertools.combinations(combo, 2))
        if total > best_score:
            best_score, best = total, combo
    return best


@dataclass(frozen=True, slots=True)
class NvidiaVendor:
    """The NVIDIA backend: cards whose type holds ``NVIDIA`` (any case)."""

    word: str = NVIDIA_VENDOR

    def owns(self, dev: DeviceUsage) -> bool:
        return self.word.lower() in dev.type.lower()

    def fit(self, devices: Sequence[DeviceUsage], request: DeviceRequest, ctx: FitContext) -> ContainerFit:
        """Walk ``devices`` from the end; the first ``nums`` cards that pass every check are granted.

        A card in MIG mode grants a MIG instance: the smallest allowed profile that holds the memory, at a
        free placement (:mod:`.mig`), and the grant carries the profile's memory and cores (§2.6). After a
        MIG card grants, it is tried again (HAMi's ``i++``), so one container may get several instances of
        one card; its earlier instances count as taken slices.
        """
        prefs = ctx.prefs
        topology, mutex = prefs.topology, prefs.mutex
        reasons: Counter[Reason] = Counter()
        nums = request.nums
        cores = request.coresreq
        picked: list[ContainerDevice] = []
        mig: list[MigAllocation] = []  # the MIG instances among ``picked`` (device_index: position there)
        prev_numa = -1
        i = len(devices)
        while i > 0:
            i -= 1
            dev = devices[i]
            if not dev.health:
                reasons[Reason.CARD_NOT_HEALTH] += 1
                continue
            if dev.id in ctx.node.cordoned:
                reasons[Reason.CARD_CORDONED] += 1
                continue
            if not type_matches(dev, request, prefs):
                reasons[Reason.CARD_TYPE_MISMATCH] += 1
                continue
            if prefs.numa_bind and dev.numa != prev_numa:
                if picked:
                    reasons[Reason.NUMA_NOT_FIT] += len(picked)
                nums = request.nums
                picked = []
                mig = []
                prev_numa = dev.numa
            if not uuid_matches(dev, prefs):
                reasons[Reason.CARD_UUID_MISMATCH] += 1
                continue
            if dev.count <= dev.used:
                reasons[Reason.CARD_TIME_SLICING_EXHAUSTED] += 1
                continue
            if mutex and dev.used > 0:
                reasons[Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
                continue
            cores = min(cores, FULL_CORES)  # HAMi's clamp persists for the rest of the walk
            memreq = 0
            if request.memreq > 0:
                memreq = request.memreq
            if request.mem_percentage != UNSET_PERCENTAGE and request.memreq == 0:
                memreq = dev.totalmem * request.mem_percentage // 100
            grant = ContainerDevice(uuid=dev.id, type=self.word, usedmem=memreq, usedcores=cores)
            if ctx.quota is not None and not ctx.quota_fits((*picked, grant)):
                reasons[Reason.RESOURCE_QUOTA_NOT_FIT] += 1
                continue
            if dev.totalmem - dev.usedmem < memreq:
                reasons[Reason.CARD_INSUFFICIENT_MEMORY] += 1
                continue
            if dev.totalcore - dev.usedcores < cores:
                reasons[Reason.CARD_INSUFFICIENT_CORE] += 1
                continue
            if dev.totalcore == FULL_CORES and cores == FULL_CORES and dev.used > 0:
                reasons[Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
                continue
            if dev.totalcore != 0 and dev.usedcores == dev.totalcore and cores == 0:
                reasons[Reason.CARD_COMPUTE_UNITS_EXHAUSTED] += 1
                continue
            instance: MigAllocation | None = None
            if dev.is_mig:
                taken = occupied_mask(dev.mig_instances)
                for earlier in mig:
                    if earlier.gpu_uuid == dev.id:
                        taken |= mask(earlier.placement)
                choice = choose_instance(dev.mig_profiles, taken, memreq, cores)
                if choice is None:
                    reasons[Reason.CARD_MIG_TOPOLOGY_INFEASIBLE] += 1
                    continue
                profile = choice.profile
                grant = ContainerDevice(uuid=dev.id, type=self.word, usedmem=profile.memory_mb, usedcores=profile.core)
                instance = MigAllocation(
                    container_index=0,
                    device_index=len(picked),
                    gpu_uuid=dev.id,
                    profile=profile.name,
                    placement=choice.placement,
                )
            again = False
            if nums > 0:
                if not topology:
                    nums -= 1
                if instance is not None:
                    mig.append(instance)
                    again = True  # the same MIG card next: it may hold another instance
                picked.append(grant)
            if nums == 0 and not topology:
                return ContainerFit(devices=tuple(picked), mig=tuple(mig), checked=len(devices))
            if again:
                i += 1
        if topology and picked:
            if len(picked) == request.nums:
                return ContainerFit(devices=tuple(picked), mig=tuple(mig), checked=len(devices))
            if len(picked) > request.nums:
                if request.nums == 1:
                    chosen: tuple[ContainerDevice, ...] = (worst_single_card(ctx.node, picked),)
                else:
                    chosen = best_combination(ctx.node, picked, request.nums)
                if chosen:
                    return ContainerFit(devices=chosen, mig=_instances_of(chosen, picked, mig), checked=len(devices))
        if picked:
            reasons[Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] = len(picked)
        return ContainerFit(rejected=dict(reasons), checked=len(devices))


def _instances_of(
    chosen: Sequence[ContainerDevice], picked: Sequence[ContainerDevice], mig: Sequence[MigAllocation]
) -> tuple[MigAllocation, ...]:
    """The MIG instances of the ``chosen`` subset of ``picked``, renumbered by their place in ``chosen``."""
    by_position = {m.device_index: m for m in mig}
    positions = {id(d): n for n, d in enumerate(picked)}
    out = []
    for n, d in enumerate(chosen):
        found = by_position.get(positions[id(d)])
        if found is not None:
            out.append(
                MigAllocation(
                    container_index=0,
                    device_index=n,
                    gpu_uuid=found.gpu_uuid,
                    profile=found.profile,
                    placement=found.placement,
                )
            )
    return tuple(out)


NVIDIA: Final = NvidiaVendor()
