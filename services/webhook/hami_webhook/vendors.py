"""The configured device families at admission (hami-vendors §0.2 "Webhook"), never one by name.

HAMi calls every backend's ``MutateAdmission`` per container, init containers first, the default family
(NVIDIA's, from the device config's top-level knobs) first. Each family judges a container
(:meth:`~hami_common.vendors.DeviceFamily.admit`) and its verdict becomes edits: limits and requests it
rewrote (NVIDIA's default count and exclusive cores, Ascend's template rounding, 910C's 1 → 2), env it
appends, a runtimeClassName for a pod without one, env a tenant may not keep. A container that asks for any
family makes the pod a device pod.

The quota pre-check covers the families too (HAMi's webhook is their only quota check except Cambricon's
Fit): per family, the pod's demand (init peak against app sum) against the namespace's
``limits.<memory>`` and ``limits.<cores>``, the memory limit in the family's own unit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hami_common.errors import InvalidInput
from hami_common.resources import ContainerResources
from hami_common.scheduling.quota import NamespaceQuota, QuotaExcess
from hami_common.vendors import DeviceFamily
from hami_webhook.patch import ContainerEdit
from hami_webhook.podview import EnvVar

__all__ = [
    "FamilyVerdict",
    "admit_families",
    "families_fit_quota",
    "families_quota_excess",
    "family_demand",
    "family_owned_annotations",
    "family_resource_names",
]


@dataclass(frozen=True, slots=True)
class FamilyVerdict:
    """One container after every family judged it: whether any asked, the resources, a runtime class."""

    asks: bool
    resources: ContainerResources
    runtime_class: str | None = None
    guarded_env: frozenset[str] = frozenset()  # env the asked families forbid unless the namespace allows it


def family_resource_names(families: Iterable[DeviceFamily]) -> tuple[str, ...]:
    """Every extended resource the families manage: asking for any of them makes a device container."""
    return tuple(name for family in families for name in family.resource_names)


def family_owned_annotations(families: Iterable[DeviceFamily]) -> frozenset[str]:
    """The pod annotations only the system may write for any configured family."""
    return frozenset(key for family in families for key in family.owned_annotations)


def _changed(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str]:
    return {key: text for key, text in after.items() if before.get(key) != text}


def admit_families(
    families: Sequence[DeviceFamily],
    res: ContainerResources,
    edit: ContainerEdit,
    pod_annotations: Mapping[str, str],
) -> FamilyVerdict:
    """Every family's ``admit`` on one container, in configuration order, each seeing the previous rewrite.

    Rewrites and env land in ``edit``; InvalidInput (HAMi's message) propagates, for Errored(500).
    """
    asks = False
    runtime_class: str | None = None
    guarded: set[str] = set()
    for family in families:
        verdict = family.admit(res, pod_annotations)
        limits = _changed(res.limits, verdict.limits)
        requests = _changed(res.requests, verdict.requests)
        if limits or requests:
            edit.limits.update(limits)
            edit.requests.update(requests)
            res = ContainerResources(res.name, {**res.limits, **limits}, {**res.requests, **requests})
        edit.env_added.extend(EnvVar(name=name, value=text) for name, text in verdict.env.items())
        if verdict.asks:
            asks = True
            guarded.update(verdict.guarded_env)
            if runtime_class is None and verdict.runtime_class:
                runtime_class = verdict.runtime_class
    return FamilyVerdict(asks=asks, resources=res, runtime_class=runtime_class, guarded_env=frozenset(guarded))


def family_demand(
    family: DeviceFamily, init: Sequence[ContainerResources], app: Sequence[ContainerResources]
) -> tuple[int, int]:
    """The pod's (MiB, cores) of one family: the larger of the init peak and the app sum, per field.

    MiB are the family's request (already times its memory factor); a container whose request the family
    drops (HAMi's "not requesting", e.g. 16Gi of Ascend memory) counts nothing.
    """
    peaks = [0, 0, 0, 0]  # init memory, init cores, app memory, app cores
    for group, is_init in ((init, True), (app, False)):
        for res in group:
            try:
                request = family.request(res)
            except InvalidInput:
                request = None
            if request is None:
                continue
            memory, cores = request.memreq * request.nums, request.coresreq * request.nums
            if is_init:
                peaks[0], peaks[1] = max(peaks[0], memory), max(peaks[1], cores)
            else:
                peaks[2], peaks[3] = peaks[2] + memory, peaks[3] + cores
    return max(peaks[0], peaks[2]), max(peaks[1], peaks[3])


def families_quota_excess(
    families: Sequence[DeviceFamily],
    quotas: Mapping[str, NamespaceQuota],
    init: Sequence[ContainerResources],
    app: Sequence[ContainerResources],
) -> tuple[DeviceFamily, QuotaExcess] | None:
    """HAMi's ``FitQuota`` per family whose resources the namespace limits (``quotas`` by common word): the
    first family, in configuration order, whose limit the pod would pass, and which limit; None when all fit."""
    for family in families:
        quota = quotas.get(family.word)
        if quota is None or (quota.memory_limit is None and quota.cores_limit is None):
            continue
        memory, cores = family_demand(family, init, app)
        excess = quota.excess(memory, cores, family.quota.memory_factor) if memory or cores else None
        if excess is not None:
            return family, excess
    return None


def families_fit_quota(
    families: Sequence[DeviceFamily],
    quotas: Mapping[str, NamespaceQuota],
    init: Sequence[ContainerResources],
    app: Sequence[ContainerResources],
) -> bool:
    """Whether the pod fits every family's namespace quota (:func:`families_quota_excess` finds none)."""
    return families_quota_excess(families, quotas, init, app) is None
