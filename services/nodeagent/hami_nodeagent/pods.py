"""The pods bound to this node, from a list+watch of ``spec.nodeName=<node>``, and which of them went away."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from hami_common.kube import Change, KubeClient, Pod, WatchCache, pod_source

__all__ = ["PodIndex", "node_pod_cache"]

_ENDED_KEEP: Final = 4096  # UIDs of ended pods remembered, so a late placement for one is not staged


def node_pod_cache(kube: KubeClient, node: str) -> WatchCache[Pod]:
    return WatchCache(pod_source(kube, field_selector=f"spec.nodeName={node}"), name=f"pods on {node}")


@dataclass(eq=False)
class PodIndex:
    """Pods of this node by UID. ``gone`` collects the UIDs of pods deleted (or finished) since the last
    :meth:`take_gone`; ``changed`` is set on every such change so a reconciler can wake up."""

    cache: WatchCache[Pod]
    on_gone: list[Callable[[Pod], None]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    _by_uid: dict[str, Pod] = field(default_factory=dict)
    _gone: dict[str, Pod] = field(default_factory=dict)
    _ended: dict[str, None] = field(default_factory=dict)  # insertion-ordered, trimmed to _ENDED_KEEP

    def __post_init__(self) -> None:
        self.cache.add_handler(self._on_change)

    @property
    def synced(self) -> bool:
        return self.cache.synced.is_set()

    def get(self, uid: str) -> Pod | None:
        return self._by_uid.get(uid)

    def ended(self, uid: str) -> bool:
        """The pod was seen deleted or finished (recently: the oldest memories are let go)."""
        return uid in self._ended

    def uids(self) -> frozenset[str]:
        return frozenset(self._by_uid)

    def take_gone(self) -> list[Pod]:
        gone = list(self._gone.values())
        self._gone.clear()
        self.changed.clear()
        return gone

    def _on_change(self, change: Change[Pod]) -> None:
        pod = change.obj
        uid = pod.metadata.uid
        if not uid:
            return
        finished = pod.status.phase in ("Succeeded", "Failed")
        if change.type == "DELETED" or finished:
            self._by_uid.pop(uid, None)
            if uid not in self._ended:
                self._ended[uid] = None
                if len(self._ended) > _ENDED_KEEP:
                    del self._ended[next(iter(self._ended))]
                self._gone[uid] = pod
                for handler in self.on_gone:
                    handler(pod)
                self.changed.set()
        else:
            self._by_uid[uid] = pod
