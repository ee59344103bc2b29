"""Card scores, node scores and card ordering (hami-protocol §4.5 step 2, §4.6), in float32 like HAMi."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from hami_common.resources import UNSET_PERCENTAGE, DeviceRequest
from hami_common.scheduling.float32 import f32, f32_div
from hami_common.scheduling.policy import BINPACK, MUTEX, NUMA, SPREAD, PodPreferences, ScoringWeights
from hami_common.scheduling.usage import DeviceUsage

__all__ = ["WEIGHT", "device_score", "node_score", "sort_devices"]

WEIGHT: Final = 10.0  # HAMi's util.Weight


_EQUAL_WEIGHTS: Final = ScoringWeights()


def device_score(
    dev: DeviceUsage, requests: Iterable[DeviceRequest], weights: ScoringWeights = _EQUAL_WEIGHTS
) -> float:
    """HAMi's ``ComputeScore``: 10 × (wSlot·slots + wCore·cores + wMem·mem), each a used fraction.

    Only requests whose type *equals* the card's type count (with real registrations the card's type is
    the model string, so the score reflects existing usage only). 0 when a denominator is 0.
    """
    req = core = mem = 0
    for r in requests:
        if r.type != dev.type:
            continue
        req += 1
        core += r.coresreq
        if 0 < r.mem_percentage != UNSET_PERCENTAGE:
            mem += dev.totalmem * r.mem_percentage // 100
        else:
            mem += r.memreq
    if dev.count == 0 or dev.totalcore == 0 or dev.totalmem == 0:
        return 0.0
    slot_term = f32(weights.slot * f32_div(req + dev.used, dev.count))
    core_term = f32(weights.core * f32_div(core + dev.usedcores, dev.totalcore))
    mem_term = f32(weights.memory * f32_div(mem + dev.usedmem, dev.totalmem))
    return f32(WEIGHT * f32(f32(slot_term + core_term) + mem_term))


def node_score(devices: Sequence[DeviceUsage]) -> float:
    """HAMi's ``ComputeDefaultScore`` on usage *before* the pod: 10 × (slots + cores + memory fractions)."""
    used = count = usedcores = totalcore = usedmem = totalmem = 0
    for d in devices:
        used += d.used
        count += d.count
        usedcores += d.usedcores
        totalcore += d.totalcore
        usedmem += d.usedmem
        totalmem += d.totalmem
    if count == 0 or totalcore == 0 or totalmem == 0:
        return 0.0
    total = f32(f32(f32_div(used, count) + f32_div(usedcores, totalcore)) + f32_div(usedmem, totalmem))
    return f32(WEIGHT * total)


def _chain_keys(policy: str, numa_bind: bool) -> list[str]:
    keys = [k.strip() for k in policy.split(",") if k.strip() in (BINPACK, SPREAD, NUMA)]
    if numa_bind:
        keys = [NUMA] + [k for k in keys if k != NUMA]
    if not any(k in (BINPACK, SPREAD) for k in keys):
        keys.append(SPREAD)
    return keys


def sort_devices(scored: Sequence[tuple[DeviceUsage, float]], prefs: PodPreferences) -> list[DeviceUsage]:
    """Order cards with the GPU policy's comparator; Fit walks the result from the end (§4.6).

    Python's sort is stable, like Go's insertion sort on the short lists a node has.
    """
    policy = prefs.gpu_policy
    items = list(scored)
    if "," in policy or policy == NUMA:
        chain = _chain_keys(policy, prefs.numa_bind)

        def chain_key(item: tuple[DeviceUsage, float]) -> tuple[float, ...]:
            dev, score = item
            parts: list[float] = []
            for k in chain:
                parts.append(score if k == BINPACK else -score if k == SPREAD else float(dev.numa))
            parts.append(float(dev.index))
            return tuple(parts)

        items.sort(key=chain_key)
    elif policy == MUTEX:
        items.sort(key=lambda it: (-it[0].used, it[0].numa))
    elif prefs.numa_bind and policy == BINPACK:
        items.sort(key=lambda it: (-it[0].numa, it[1]))
    elif prefs.numa_bind:
        items.sort(key=lambda it: (it[0].numa, -it[1]))
    elif policy == BINPACK:
        items.sort(key=lambda it: (it[1], it[0].numa))
    else:
        items.sort(key=lambda it: (-it[1], it[0].numa))
    return [dev for dev, _ in items]
