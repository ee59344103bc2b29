"""HAMi's node registration checks (hami-protocol §2.4, §4.2): handshake writes and NodeCleanUp.

The scheduler writes ``Requesting_<now>`` on every registered GPU node whose handshake is absent, and
judges each node with CheckHealth and the NVIDIA wrapper (:func:`hami_common.scheduling.node_health`).
An unhealthy node is cleaned up: its handshake annotation is removed (merge-patch null) and its cards
leave the ledger until the next pass, which finds the handshake gone, writes a fresh one and takes the
node back, as HAMi's 15-second loop does. Only the leader writes; a follower judges without writing.

Watch events are judged as they come, so a pass only revisits the few nodes whose verdict can change
with time alone (no GPUs allocatable), cleaned nodes, and nodes owed a write while this process did not
lead: a pass never walks every node, so it never stalls /filter on a large cluster.

The other device families with a handshake key (hami-vendors §0.2) are judged the same way, each on its
own key with the generic verdict (:func:`hami_common.vendors._common.handshake_verdict`): an unhealthy
family is cleaned up (its key removed) and only its devices leave the node, until the next pass.
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
from hami_common.vendors import DeviceFamily
from hami_common.vendors._common import allocatable_count, handshake_verdict

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
    _writes: asyncio.Queue[tuple[str, str]] = field(default_factory=asyncio.Queue)  # (node, key), each once
    _pending: dict[tuple[str, str], str | None] = field(default_factory=dict)  # -> the value (None: remove)
    _families_cleaned: set[tuple[str, str]] = field(default_factory=set)  # (node, word) out until the next pass
    _families_recheck: dict[str, set[str]] = field(default_factory=dict)  # node -> words the next pass judges

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
                self._write(name, NODE_HANDSHAKE, None)
            return False
        if health.write_handshake and leading:
            self._write(name, NODE_HANDSHAKE, encode_handshake(now))
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

    def admit_family(self, node: Node, family: DeviceFamily, *, on_pass: bool = False) -> bool:
        """Judge one family with a handshake key on a node showing it; True when its devices may count."""
        key = family.handshake_key
        if key is None:
            return True  # no handshake (Cambricon): always healthy, devices read every time
        name, word = node.metadata.name, family.word
        if (name, word) in self._families_cleaned and not on_pass:
            return False
        self._families_cleaned.discard((name, word))
        value = node.metadata.annotations.get(key)
        allocatable = allocatable_count(node.status.allocatable, family.resource_names[0])
        outcome = handshake_verdict(key, value, self.clock(), allocatable)
        leading = self.leading()
        rechecks = self._families_recheck.setdefault(name, set())
        if not outcome.healthy:
            self._families_cleaned.add((name, word))
            rechecks.discard(word)
            log.warning(
                "node %s failed the %s handshake check (%s %r, %d allocatable): its %s devices are dropped",
                name, word, key, value, allocatable, word, extra={logkeys.NODE: name},
            )  # fmt: skip
            if leading and value is not None:
                self._write(name, key, None)
        else:
            if outcome.patch is not None and leading:
                self._write(name, key, outcome.patch)
            # a Requesting value ages into a verdict without any event: look again while nothing is allocatable
            if allocatable == 0 or (outcome.patch is not None and not leading):
                rechecks.add(word)
            else:
                rechecks.discard(word)
        if not rechecks:
            del self._families_recheck[name]
        return outcome.healthy

    def forget_family(self, name: str, word: str) -> None:
        """The node no longer shows this family."""
        self._families_cleaned.discard((name, word))
        rechecks = self._families_recheck.get(name)
        if rechecks is not None:
            rechecks.discard(word)
            if not rechecks:
                del self._families_recheck[name]

    def due(self) -> list[str]:
        """The nodes the next pass judges again."""
        families = {n for n, _ in self._families_cleaned} | self._families_recheck.keys()
        return sorted(self._cleaned | self._recheck | families)

    def _write(self, name: str, key: str, value: str | None) -> None:
        if (name, key) not in self._pending:
            self._writes.put_nowait((name, key))
        self._pending[(name, key)] = value  # a later verdict replaces one not yet written

    async def run_writes(self, nodes: NodePatcher, call_timeout: float) -> None:
        """Write queued handshakes and cleanups, one merge patch each (owned by the lifespan)."""
        while True:
            name, key = await self._writes.get()
            value = self._pending.pop((name, key))
            try:
                async with asyncio.timeout(call_timeout):
                    await nodes.patch_node_annotations(name, {key: value})
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
