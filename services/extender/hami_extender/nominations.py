"""Pods kube-scheduler has nominated to a node after preempting for them (``status.nominatedNodeName``).

Between the victims' eviction and the preemptor's bind, the freed cards must not go to another pod. kube-scheduler
keeps what it counts (the slices) for nominated pods of at least the same priority; the memory and cores it
cannot see are kept here: Filter fits each such nominee on the node first and offers a less important pod
only what is left, so a preemption's gain is never taken by the pod behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hami_common.errors import InvalidInput
from hami_common.kube import Change, Pod
from hami_common.resources import PodRequest
from hami_common.scheduling import PodFamilies, PodPreferences, SchedulerDefaults, preferences_from_annotations

__all__ = ["Nominations", "Nominee"]


@dataclass(frozen=True, slots=True)
class Nominee:
    uid: str
    priority: int
    request: PodRequest
    prefs: PodPreferences
    families: PodFamilies | None = None  # the device families its fit consults (None: the primary alone)


def _primary_only(request: PodRequest, annotations: Mapping[str, str], prefs: PodPreferences) -> PodFamilies | None:
    return None


@dataclass(eq=False)
class Nominations:
    request_of: Callable[[Pod], PodRequest]
    defaults: SchedulerDefaults = field(default_factory=SchedulerDefaults)
    plan: Callable[[PodRequest, Mapping[str, str], PodPreferences], PodFamilies | None] = _primary_only
    _nodes: dict[str, str] = field(default_factory=dict)  # uid -> the node it is nominated to
    _by_node: dict[str, dict[str, Nominee]] = field(default_factory=dict)

    def on_pod(self, change: Change[Pod]) -> None:
        """Watch handler: a pending pod with a nomination holds its place; bound, deleted or cleared, it does not."""
        pod = change.obj
        meta = pod.metadata
        node = pod.status.nominated_node_name
        self._drop(meta.uid)
        if change.type == "DELETED" or not node or pod.spec.node_name or meta.deletion_timestamp:
            return
        try:
            request = self.request_of(pod)
            prefs = preferences_from_annotations(meta.annotations, meta.namespace, self.defaults)
        except InvalidInput:
            return  # Filter refuses it with the reason; it holds nothing meanwhile
        if not request.has_devices:
            return
        self._nodes[meta.uid] = node
        families = self.plan(request, meta.annotations, prefs)
        self._by_node.setdefault(node, {})[meta.uid] = Nominee(meta.uid, pod.spec.priority, request, prefs, families)

    def _drop(self, uid: str) -> None:
        node = self._nodes.pop(uid, None)
        if node is not None:
            held = self._by_node.get(node, {})
            held.pop(uid, None)
            if not held:
                self._by_node.pop(node, None)

    def ahead_of(self, node: str, uid: str, priority: int) -> list[Nominee]:
        """The nominees on ``node`` that go before a pod of ``priority`` (at least as important, not itself),
        most important first."""
        held = self._by_node.get(node)
        if not held:
            return []
        ahead = [n for n in held.values() if n.uid != uid and n.priority >= priority]
        return sorted(ahead, key=lambda n: (-n.priority, n.uid))
