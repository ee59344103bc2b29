"""Namespace GPU quota as the webhook sees it (hami-protocol §4.8): limits from ResourceQuotas, usage from pods.

:class:`QuotaBook` is fed by two watch caches (ResourceQuotas, and every pod: a label such as
``hami.io/vgpu-node`` is the tenant's to remove, so usage comes from the scheduler-owned device annotation
alone) and keeps per-namespace totals incrementally, so a request reads two dictionary entries. A pod's
usage is its device annotation, init containers collapsed (§4.9); pods that finished hold nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from hami_common import logkeys
from hami_common.annotations import DEVICES_ALLOCATED, DEVICES_TO_ALLOCATE, decode_pod_devices
from hami_common.errors import InvalidInput
from hami_common.events import QuotaResource, QuotaUsage
from hami_common.kube import Change, Pod, ResourceQuota
from hami_common.resources import ResourceConfig
from hami_common.scheduling.quota import NamespaceQuota, quota_from_hard
from hami_common.scheduling.usage import collapse_devices

__all__ = ["FINISHED_PHASES", "QuotaBook", "pod_usage"]

log = logging.getLogger(__name__)

FINISHED_PHASES: Final = frozenset({"Succeeded", "Failed"})
Usage = tuple[int, int]  # (MiB, core percent)


def pod_usage(pod: Pod) -> Usage:
    """What a placed pod holds: Σ memory and cores over its collapsed devices; (0, 0) when it holds nothing.

    Raises InvalidInput when the device annotation does not follow its grammar.
    """
    if pod.status.phase in FINISHED_PHASES:
        return 0, 0
    annotations = pod.metadata.annotations
    key = DEVICES_ALLOCATED if annotations.get(DEVICES_ALLOCATED) else DEVICES_TO_ALLOCATE
    text = annotations.get(key)
    if not text:
        return 0, 0
    containers = decode_pod_devices(text, key)
    n_init = len(pod.spec.init_containers)
    charges = collapse_devices(containers[:n_init], containers[n_init:])
    return sum(c.usedmem for c in charges), sum(c.usedcores for c in charges)


@dataclass(eq=False)
class QuotaBook:
    """Per-namespace limits and usage, kept current by :meth:`on_quota` and :meth:`on_pod`."""

    config: ResourceConfig = field(default_factory=ResourceConfig)
    _hards: dict[str, dict[str, Mapping[str, str]]] = field(default_factory=dict)  # ns -> quota name -> hard
    _limits: dict[str, NamespaceQuota] = field(default_factory=dict)
    _pods: dict[tuple[str, str], Usage] = field(default_factory=dict)
    _used: dict[str, Usage] = field(default_factory=dict)
    changed: set[str] = field(default_factory=set)  # namespaces whose limits or usage moved since last taken

    def quota(self, namespace: str) -> NamespaceQuota:
        """The namespace's limits (None where unset) with its current usage."""
        limits = self._limits.get(namespace)
        used = self._used.get(namespace, (0, 0))
        if limits is None:
            return NamespaceQuota(used_memory=used[0], used_cores=used[1])
        return NamespaceQuota(limits.memory_limit, limits.cores_limit, used[0], used[1])

    def on_quota(self, change: Change[ResourceQuota]) -> None:
        meta = change.obj.metadata
        quotas = self._hards.setdefault(meta.namespace, {})
        if change.type == "DELETED":
            quotas.pop(meta.name, None)
        else:
            quotas[meta.name] = change.obj.spec.hard
        self._limits[meta.namespace] = self._tightest(quotas.values())
        if not quotas:
            del self._hards[meta.namespace]
            del self._limits[meta.namespace]
        self.changed.add(meta.namespace)

    def _tightest(self, hards: Iterable[Mapping[str, str]]) -> NamespaceQuota:
        """Every ResourceQuota of a namespace must hold, so the smallest limit of each kind counts."""
        memory: int | None = None
        cores: int | None = None
        for hard in hards:
            one = quota_from_hard([hard], self.config.memory_name, self.config.core_name)
            if one.memory_limit is not None:
                memory = one.memory_limit if memory is None else min(memory, one.memory_limit)
            if one.cores_limit is not None:
                cores = one.cores_limit if cores is None else min(cores, one.cores_limit)
        return NamespaceQuota(memory_limit=memory, cores_limit=cores)

    def on_pod(self, change: Change[Pod]) -> None:
        meta = change.obj.metadata
        key = (meta.namespace, meta.name)
        usage: Usage = (0, 0)
        if change.type != "DELETED":
            try:
                usage = pod_usage(change.obj)
            except InvalidInput as err:
                log.warning(
                    "pod %s/%s: device annotation ignored for quota: %s",
                    meta.namespace,
                    meta.name,
                    err,
                    extra={logkeys.POD_UID: meta.uid},
                )
        before = self._pods.pop(key, (0, 0))
        if usage != (0, 0):
            self._pods[key] = usage
        if usage == before:
            return
        mem, cores = self._used.get(meta.namespace, (0, 0))
        total = (mem - before[0] + usage[0], cores - before[1] + usage[1])
        if meta.namespace in self._limits:
            self.changed.add(meta.namespace)
        if total == (0, 0):
            self._used.pop(meta.namespace, None)
        else:
            self._used[meta.namespace] = total

    def limited(self) -> list[str]:
        """Namespaces with a GPU quota (a ResourceQuota setting limits.<memory> or limits.<cores>)."""
        return sorted(ns for ns, q in self._limits.items() if q.memory_limit is not None or q.cores_limit is not None)

    def take_changed(self) -> list[str]:
        """The namespaces changed since the last call (each once), sorted."""
        changed, self.changed = self.changed, set()
        return sorted(changed)

    def usage(self, namespace: str, at_ns: int) -> QuotaUsage:
        """The namespace's quota as announced on the bus: each tracked resource with a limit, used and limit.

        Used and limit are in the resource's own unit (MiB, core percent), as HAMi's QuotaUsed reports them.
        """
        q = self.quota(namespace)
        resources = tuple(
            QuotaResource(name=name, used=used, limit=limit)
            for name, used, limit in (
                (self.config.memory_name, q.used_memory, q.memory_limit),
                (self.config.core_name, q.used_cores, q.cores_limit),
            )
            if limit is not None
        )
        return QuotaUsage(namespace=namespace, resources=resources, at_ns=at_ns)
