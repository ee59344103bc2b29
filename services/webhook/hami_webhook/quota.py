"""Namespace device quota as the webhook sees it (hami-protocol §4.8): limits from ResourceQuotas, usage from pods.

:class:`QuotaBook` is fed by two watch caches (ResourceQuotas, and every pod: a label such as
``hami.io/vgpu-node`` is the tenant's to remove, so usage comes from the scheduler-owned device annotations
alone) and keeps per-namespace totals incrementally, so a request reads a few dictionary entries. It tracks
one :class:`Track` per device family, in HAMi's order (its ``QuotaSpec``), each with its own
``limits.<memory>`` and ``limits.<cores>`` and its own device annotation. A pod's usage is its
device annotations, init containers collapsed (§4.9); pods that finished hold nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from hami_common import logkeys
from hami_common.annotations import PodDevices
from hami_common.errors import InvalidInput
from hami_common.events import QuotaResource, QuotaUsage
from hami_common.kube import Change, Pod, ResourceQuota
from hami_common.scheduling.quota import NamespaceQuota, quota_from_hard
from hami_common.scheduling.usage import collapse_devices
from hami_common.vendors import DeviceFamily, device_families

__all__ = ["FINISHED_PHASES", "QuotaBook", "Track", "pod_usage"]

log = logging.getLogger(__name__)

FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})
Usage = tuple[int, int]  # (MiB, core percent)
_NOTHING: Final[Usage] = (0, 0)


PodDevicesReader = Callable[[Mapping[str, str]], PodDevices]  # a pod's annotations -> its devices, per container


@dataclass(frozen=True, slots=True)
class Track:
    """One vendor's quota: the resources a ResourceQuota limits and how a pod's devices of it are read."""

    memory_name: str
    core_name: str
    devices: PodDevicesReader

    @classmethod
    def of(cls, family: DeviceFamily) -> Track:
        spec = family.quota
        return cls(spec.memory_name, spec.core_name, family.allocated)


def pod_usage(pod: Pod, devices: PodDevicesReader) -> Usage:
    """What a placed pod holds of one vendor: Σ memory and cores over its collapsed devices; (0, 0) when it
    holds nothing. ``devices`` reads the vendor's device annotation.

    Raises InvalidInput when the device annotation does not follow its grammar.
    """
    if pod.status.phase in FINISHED_PHASES:
        return _NOTHING
    containers = devices(pod.metadata.annotations)
    if not containers:
        return _NOTHING
    n_init = len(pod.spec.init_containers)
    charges = collapse_devices(containers[:n_init], containers[n_init:])
    return sum(c.usedmem for c in charges), sum(c.usedcores for c in charges)


def _tightest(hards: Iterable[Mapping[str, str]], track: Track) -> NamespaceQuota:
    """Every ResourceQuota of a namespace must hold, so the smallest limit of each kind counts."""
    memory: int | None = None
    cores: int | None = None
    for hard in hards:
        one = quota_from_hard([hard], track.memory_name, track.core_name)
        if one.memory_limit is not None:
            memory = one.memory_limit if memory is None else min(memory, one.memory_limit)
        if one.cores_limit is not None:
            cores = one.cores_limit if cores is None else min(cores, one.cores_limit)
    return NamespaceQuota(memory_limit=memory, cores_limit=cores)


def _limited(q: NamespaceQuota) -> bool:
    return q.memory_limit is not None or q.cores_limit is not None


@dataclass(eq=False)
class QuotaBook:
    """Per-namespace limits and usage of every vendor, kept current by :meth:`on_quota` and :meth:`on_pod`.

    One track per family, by common word (:meth:`quota`, :meth:`quotas`).
    """

    families: Sequence[DeviceFamily] = field(default_factory=device_families)
    tracks: tuple[Track, ...] = field(init=False)
    _words: tuple[str, ...] = field(init=False)  # the families' common words, track i each
    _hards: dict[str, dict[str, Mapping[str, str]]] = field(default_factory=dict)  # ns -> quota name -> hard
    _limits: dict[str, tuple[NamespaceQuota, ...]] = field(default_factory=dict)  # ns -> per track
    _pods: dict[tuple[str, str], tuple[Usage, ...]] = field(default_factory=dict)
    _used: dict[str, tuple[Usage, ...]] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)  # namespaces whose limits or usage moved since last taken

    def __post_init__(self) -> None:
        self.tracks = tuple(Track.of(f) for f in self.families)
        self._words = tuple(f.word for f in self.families)

    def _quota(self, namespace: str, track: int) -> NamespaceQuota:
        limits = self._limits.get(namespace)
        used = self._used.get(namespace)
        memory, cores = _NOTHING if used is None else used[track]
        if limits is None:
            return NamespaceQuota(used_memory=memory, used_cores=cores)
        return NamespaceQuota(limits[track].memory_limit, limits[track].cores_limit, memory, cores)

    def quota(self, namespace: str, word: str) -> NamespaceQuota:
        """The namespace's limits of one family (None where unset) with its current usage."""
        return self._quota(namespace, self._words.index(word))

    def quotas(self, namespace: str) -> dict[str, NamespaceQuota]:
        """The families the namespace limits, by common word, each with its current usage."""
        limits = self._limits.get(namespace)
        if limits is None:
            return {}
        return {word: self._quota(namespace, i) for i, word in enumerate(self._words) if _limited(limits[i])}

    def on_quota(self, change: Change[ResourceQuota]) -> None:
        meta = change.obj.metadata
        quotas = self._hards.setdefault(meta.namespace, {})
        if change.type == "DELETED":
            quotas.pop(meta.name, None)
        else:
            quotas[meta.name] = change.obj.spec.hard
        self._limits[meta.namespace] = tuple(_tightest(quotas.values(), track) for track in self.tracks)
        if not quotas:
            del self._hards[meta.namespace]
            del self._limits[meta.namespace]
        self.changed.add(meta.namespace)

    def _pod_usage(self, pod: Pod) -> tuple[Usage, ...]:
        usage: list[Usage] = []
        for track in self.tracks:
            try:
                usage.append(pod_usage(pod, track.devices))
            except InvalidInput as err:
                meta = pod.metadata
                log.warning(
                    "pod %s/%s: device annotation ignored for quota: %s",
                    meta.namespace,
                    meta.name,
                    err,
                    extra={logkeys.POD_UID: meta.uid},
                )
                usage.append(_NOTHING)
        return tuple(usage)

    def on_pod(self, change: Change[Pod]) -> None:
        meta = change.obj.metadata
        key = (meta.namespace, meta.name)
        nothing = (_NOTHING,) * len(self.tracks)
        usage = nothing if change.type == "DELETED" else self._pod_usage(change.obj)
        before = self._pods.pop(key, nothing)
        if usage != nothing:
            self._pods[key] = usage
        if usage == before:
            return
        used = self._used.get(meta.namespace, nothing)
        total = tuple(
            (mem - was[0] + now[0], cores - was[1] + now[1])
            for (mem, cores), was, now in zip(used, before, usage, strict=True)
        )
        if meta.namespace in self._limits:
            self.changed.add(meta.namespace)
        if total == nothing:
            self._used.pop(meta.namespace, None)
        else:
            self._used[meta.namespace] = total

    def limited(self) -> list[str]:
        """Namespaces with a device quota (a ResourceQuota setting limits.<memory> or limits.<cores> of a
        tracked vendor)."""
        return sorted(ns for ns, limits in self._limits.items() if any(_limited(q) for q in limits))

    def take_changed(self) -> list[str]:
        """The namespaces changed since the last call (each once), sorted."""
        changed, self.changed = self.changed, set()
        return sorted(changed)

    def usage(self, namespace: str, at_ns: int) -> QuotaUsage:
        """The namespace's quota as announced on the bus: each tracked resource with a limit, used and limit.

        Used and limit are as HAMi's QuotaUsed reports them: used in MiB and core percent, the limit as the
        ResourceQuota writes it (for Cambricon, 256 MiB units: HAMi scales it only when checking).
        """
        resources: list[QuotaResource] = []
        for i, track in enumerate(self.tracks):
            q = self._quota(namespace, i)
            for name, used, limit in (
                (track.memory_name, q.used_memory, q.memory_limit),
                (track.core_name, q.used_cores, q.cores_limit),
            ):
                if limit is not None and name:
                    resources.append(QuotaResource(name=name, used=used, limit=limit))
        return QuotaUsage(namespace=namespace, resources=tuple(resources), at_ns=at_ns)
