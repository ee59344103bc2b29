"""The node hand-off (ARCHITECTURE §3): at most one pod per node between bind and allocation.

The kubelet's ``Allocate`` does not say which pod it serves, so a node may have only one pod in flight.
Unlike HAMi's five-minute lock, a hold ends the moment its end is seen: the pod's allocation results on the
bus, its deletion, its settled bind phase, or a failed bind. Holds of different nodes are independent; a
bind to a held node waits for the release (up to a limit) instead of failing at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hami_common.errors import Conflict

__all__ = ["Hold", "NodeHandoff"]


@dataclass(eq=False)
class Hold:
    node: str
    uid: str
    namespace: str
    name: str
    since: float
    expected: int  # containers with a GPU: allocation results to see before the hold ends
    served: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class NodeHandoff:
    expiry: float = 300.0  # a hold older than this is taken over (HAMi's lock timeout)
    monotonic: Callable[[], float] = time.monotonic
    _holds: dict[str, Hold] = field(default_factory=dict)
    _by_pod: dict[str, str] = field(default_factory=dict)

    def holder(self, node: str) -> Hold | None:
        return self._holds.get(node)

    def __len__(self) -> int:
        return len(self._holds)

    async def acquire(self, node: str, uid: str, namespace: str, name: str, expected: int, wait: float) -> Hold:
        """Hold ``node`` for the pod; waits up to ``wait`` seconds for another pod's hold to end."""
        deadline = self.monotonic() + wait
        while True:
            hold = self._holds.get(node)
            now = self.monotonic()
            if hold is None or hold.uid == uid or now - hold.since >= self.expiry:
                if hold is not None and hold.uid != uid:
                    self._end(hold)
                taken = Hold(node=node, uid=uid, namespace=namespace, name=name, since=now, expected=expected)
                self._holds[node] = taken
                self._by_pod[uid] = node
                return taken
            remaining = deadline - now
            if remaining <= 0:
                raise Conflict(f"node {node} has been locked within {self.expiry:g}s: node lock contention")
            try:
                async with asyncio.timeout(remaining):
                    await hold.released.wait()
            except TimeoutError:
                continue

    def _end(self, hold: Hold) -> None:
        if self._holds.get(hold.node) is hold:
            del self._holds[hold.node]
        if self._by_pod.get(hold.uid) == hold.node:
            del self._by_pod[hold.uid]
        hold.released.set()

    def elsewhere(self, uid: str, node: str) -> Hold | None:
        """The pod's hold on another node than ``node``, if any: a pod binds to one node only, so a bind to
        ``node`` means that hold (left by a bind whose outcome was unknown) will never be served."""
        held = self._by_pod.get(uid)
        hold = self._holds.get(held) if held is not None and held != node else None
        return hold if hold is not None and hold.uid == uid else None

    def release(self, uid: str) -> Hold | None:
        """End the pod's hold, wherever it is; returns it (None when the pod held nothing)."""
        node = self._by_pod.get(uid)
        hold = self._holds.get(node) if node is not None else None
        if hold is None or hold.uid != uid:
            return None
        self._end(hold)
        return hold

    def served(self, uid: str, ok: bool) -> Hold | None:
        """One allocation result for the pod: the hold ends on a failure or when every container is served."""
        node = self._by_pod.get(uid)
        hold = self._holds.get(node) if node is not None else None
        if hold is None or hold.uid != uid:
            return None
        hold.served += 1
        if not ok or hold.served >= hold.expected:
            self._end(hold)
            return hold
        return None
