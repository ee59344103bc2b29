"""What the webhook keeps from the apiserver: watch caches of ResourceQuotas, pods and namespaces.

The request path reads only this in-memory state (no per-request I/O). Until the caches have listed once,
:meth:`ClusterState.namespace` answers with what it has (no quota, no permission to disable control):
the webhook is not ready until then (``/readyz``).

The namespace watch also says which namespaces exist (:meth:`ClusterState.exists`): the webhook announces
reviews on the bus only for those, so reviews forged for made-up namespaces make no metric series (issue 28
item 9). A namespace created a few milliseconds before its first pod may still be missing from the watch:
that admission goes unannounced, which only undercounts a metric.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from hami_common.kube import (
    Backoff,
    KubeClient,
    ListWatch,
    ObjectMeta,
    Pod,
    ResourceQuota,
    WatchCache,
    pod_source,
    quota_source,
)
from hami_common.vendors import DeviceFamily, device_families
from hami_webhook.admission import NamespaceState
from hami_webhook.quota import QuotaBook

__all__ = ["ClusterState", "LabelRule", "Namespace", "parse_label_rule"]


class Namespace(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A core/v1 Namespace; only its labels matter here."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


@dataclass(frozen=True, slots=True)
class LabelRule:
    """``key`` (the label is present) or ``key=value`` (it has that value)."""

    key: str
    value: str | None = None

    def matches(self, labels: dict[str, str]) -> bool:
        found = labels.get(self.key)
        return found is not None and (self.value is None or found == self.value)


def parse_label_rule(text: str) -> LabelRule | None:
    """A rule from its setting; None for an empty setting (no namespace matches)."""
    text = text.strip()
    if not text:
        return None
    key, sep, val = text.partition("=")
    return LabelRule(key.strip(), val.strip() if sep else None)


@dataclass(eq=False)
class ClusterState:
    """The caches and the quota book built from them. ``await run()`` inside the app's TaskGroup."""

    kube: KubeClient
    disable_control_rule: LabelRule | None = None
    families: Sequence[DeviceFamily] = field(default_factory=device_families)  # each family's quota is tracked
    book: QuotaBook = field(init=False)
    quotas: WatchCache[ResourceQuota] = field(init=False)
    pods: WatchCache[Pod] = field(init=False)
    namespaces: WatchCache[Namespace] = field(init=False)

    def __post_init__(self) -> None:
        s = self.kube.settings
        backoff = Backoff(initial=s.kube_backoff_initial, cap=s.kube_backoff_max)
        self.book = QuotaBook(self.families)
        self.quotas = WatchCache(quota_source(self.kube), backoff=backoff, name="resourcequotas")
        self.quotas.add_handler(self.book.on_quota)
        # Every pod, not only those labelled hami.io/vgpu-node: labels are the tenant's to remove, and a pod
        # that dropped it would leave the watch and its devices the namespace's usage. What counts is the
        # scheduler-owned device annotation (which the webhook guards), read by pod_usage.
        self.pods = WatchCache(pod_source(self.kube), backoff=backoff, name="pods")
        self.pods.add_handler(self.book.on_pod)
        source = ListWatch(self.kube, "namespaces", Namespace, self.kube.core.list_namespace)
        self.namespaces = WatchCache(source, backoff=backoff, name="namespaces")

    def _caches(self) -> list[WatchCache[ResourceQuota] | WatchCache[Pod] | WatchCache[Namespace]]:
        return [self.quotas, self.pods, self.namespaces]

    async def run(self) -> None:
        """List and watch until cancelled."""
        async with asyncio.TaskGroup() as tg:
            for cache in self._caches():
                tg.create_task(cache.run(), name=f"watch {cache.name}")

    def is_synced(self) -> bool:
        """Every cache has listed once (``/readyz``)."""
        return all(cache.synced.is_set() for cache in self._caches())

    async def wait_synced(self) -> None:
        for cache in self._caches():
            await cache.synced.wait()

    def namespace(self, name: str) -> NamespaceState:
        may_disable = False
        if self.disable_control_rule is not None:
            ns = self.namespaces.get("", name)
            may_disable = ns is not None and self.disable_control_rule.matches(ns.metadata.labels)
        return NamespaceState(may_disable_control=may_disable, quotas=self.book.quotas(name))

    def exists(self, name: str) -> bool:
        """Whether the namespace exists as the watch knows it (before its first list: every name does)."""
        return not self.namespaces.synced.is_set() or self.namespaces.get("", name) is not None
