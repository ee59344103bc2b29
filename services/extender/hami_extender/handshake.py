"""HAMi's node registration checks (hami-protocol §2.4, §4.2): handshake writes and NodeCleanUp.

The scheduler writes ``Requesting_<now>`` on every registered GPU node whose handshake is absent, and
judges each node with CheckHealth and the NVIDIA wrapper (:func:`hami_common.scheduling.node_health`).
An unhealthy node is cleaned up: its handshake annotation is removed (merge-patch null) and its cards
leave the ledger until the next pass, which finds the handshake gone, writes a fresh one and takes the
node back, as HAMi's 15-second loop does. Only the leader writes; a follower judges without writing.

Watch events are judged as they come, so a pass only revisits the few nodes whose verdict can change
with time alone (no GPUs allocatable), cleaned nodes, and nodes owed a write while this process did not
lead: a pass never walks every node, so it never stalls /filter on a large cluster.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from hami_common import logkeys
from hami_common.annotations import NODE_HANDSHAKE, encode_handshake
from hami_common.errors import HamiError
from hami_common.kube import Node, NodePatcher
from hami_common.resources import GPU
from hami_common.scheduling import NodeReport, allocatable_gpus, node_health

__all__ = ["NodeHandshakes"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class NodeHandshakes:
    clock: Callable[[], datetime]  # the scheduler's local time: the handshake carries it without a zone
    leading: Callable[[], bool]
    resource: str = GPU
    written: int = 0
    cleaned_up: int = 0
    write_failures: int = 0
    _reports: dict[str, NodeReport] = field(default_factory=dict)
    _cleaned: set[str] = field(default_factory=set)  # out of the ledger until the next pass
    _recheck: set[str] = field(default_factory=set)  # the next pass judges these again
    _writes: asyncio.Queue[str] = field(default_factory=asyncio.Queue)  # node names, each queued once
    _pending: dict[str, str | None] = field(default_factory=dict)  # node -> the value to write (None: remove)

    def admit(self, node: Node, register: str, *, on_pass: bool = False) -> bool:
        """Judge a registered node; True when its cards may be in the ledger. Queues the writes it owes."""
        name = node.metadata.name
        if name in self._cleaned and not on_pass:
            return False  # e.g. the event of our own cleanup: HAMi takes the node back on the next pass only
        self._cleaned.discard(name)
        handshake = node.metadata.annotations.get(NODE_HANDSHAKE)
        allocatable = allocatable_gpus(node.status.allocatable, self.resource)
        now = self.clock()
        health = node_health(handshake, register, allocatable, self._reports.get(name, NodeReport()), now)
        self._reports[name] = health.report
        leading = self.leading()
        if not health.healthy:
            self._cleaned.add(name)
            self._recheck.discard(name)
            log.warning(
                "node %s failed the handshake check (handshake %r, %d GPUs allocatable): its cards are dropped",
                name,
                handshake,
                allocatable,
                extra={logkeys.NODE: name},
            )
            if leading and handshake is not None:
                self._write(name, None)
            return False
        if health.write_handshake and leading:
            self._write(name, encode_handshake(now))
        if allocatable == 0 or (health.write_handshake and not leading):
            self._recheck.add(name)
        else:
            self._recheck.discard(name)
        return True

    def forget(self, name: str) -> None:
        """The node is gone or registers no cards: nothing to judge or write any more."""
        self._reports.pop(name, None)
        self._cleaned.discard(name)
        self._recheck.discard(name)

    def due(self) -> list[str]:
        """The nodes the next pass judges again."""
        return sorted(self._cleaned | self._recheck)

    def _write(self, name: str, value: str | None) -> None:
        if name not in self._pending:
            self._writes.put_nowait(name)
        self._pending[name] = value  # a later verdict replaces one not yet written

    async def run_writes(self, nodes: NodePatcher, call_timeout: float) -> None:
        """Write queued handshakes and cleanups, one merge patch each (owned by the lifespan)."""
        while True:
            name = await self._writes.get()
            value = self._pending.pop(name)
            try:
                async with asyncio.timeout(call_timeout):
                    await nodes.patch_node_annotations(name, {NODE_HANDSHAKE: value})
                if value is None:
                    self.cleaned_up += 1
                else:
                    self.written += 1
            except (HamiError, TimeoutError) as err:
                self.write_failures += 1
                log.warning("handshake of node %s not written: %s", name, err or "timeout", extra={logkeys.NODE: name})

    async def run_passes(
        self, cached: Callable[[str, str], Node | None], judge: Callable[[Node], None], interval: float
    ) -> None:
        """Every ``interval`` seconds, judge the due nodes again (owned by the lifespan)."""
        while True:
            await asyncio.sleep(interval)
            for name in self.due():
                node = cached("", name)
                if node is None:
                    self.forget(name)
                else:
                    judge(node)
