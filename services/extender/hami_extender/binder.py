"""Bind (hami-protocol §4.10) with the node hand-off of ARCHITECTURE §3.

Hold the node (in memory, and with HAMi's ``hami.io/mutex.lock`` annotation so mixed deployments stay
safe), mark the pod ``allocating`` with its bind time, POST ``pods/binding``, then publish the placement.
The hold ends on the pod's allocation results, its deletion, its settled bind phase, or a failed bind.

A pod takes the locks its families name (:mod:`.families`): HAMi's shared ``hami.io/mutex.lock``, or a
family's own key holding a bare RFC 3339 time that counts as stale after the family's expiry (Cambricon's).
Their device plugins release them after Allocate, as in HAMi; a bind that fails before the Binding is sent
removes a family's own lock if it still holds our value. A family our allocator serves
(``NodeLockSpec.bus_placed``) skips HAMi's lock on a node whose allocator is ours: the in-memory hold, which
waits for our allocator's results and so covers those families' containers only, orders the binds there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, Protocol

import msgspec

from hami_common import logkeys, spans
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    BIND_PHASE_FAILED,
    BIND_PHASE_SUCCESS,
    BIND_TIME,
    NODE_LOCK,
    TRACE_CONTEXT,
    NodeLock,
    decode_node_lock,
    decode_rfc3339,
    encode_node_lock,
    encode_rfc3339,
    encode_unix_seconds,
)
from hami_common.errors import (
    AnnotationError,
    Conflict,
    Forbidden,
    HamiError,
    InvalidInput,
    NotFound,
    TransientError,
)
from hami_common.events import ContainerPlacement, PlacedDevice, PlacementDecision
from hami_common.kube import (
    AnnotationChanges,
    Change,
    Node,
    NodePatcher,
    Pod,
    PodBinder,
    PodPatcher,
    PodReader,
    reference_to,
    update_node_annotations,
)
from hami_common.resources import ResourceConfig
from hami_common.scheduling import DEFAULT_SCHEDULER_NAME
from hami_common.tracing import context_from_annotation, tracer
from hami_common.vendors import NodeLockSpec
from hami_extender.families import Families
from hami_extender.handoff import NodeHandoff
from hami_extender.ledger import Booking, Ledger
from hami_extender.notices import BINDING_FAILED, BINDING_SUCCEED, NoticeQueue
from hami_extender.placer import request_of
from hami_extender.publisher import PlacementPublisher
from hami_extender.sync import booking_from, placed_over_bus
from hami_extender.timings import FilterTimes
from hami_extender.wire import BindingArgs

__all__ = ["BindPort", "Binder", "placement_of"]

UNLOCK_RETRY_S: Final = 1.0  # a lock that could not be removed is tried again after this long
# A pod in these bind phases is bound, or being bound by a HAMi scheduler that patches them before binding.
_BOUND_PHASES: Final = frozenset({BIND_PHASE_ALLOCATING, BIND_PHASE_SUCCESS})

log = logging.getLogger(__name__)


class BindPort(PodReader, PodPatcher, NodePatcher, PodBinder, Protocol):
    """What Bind needs of the apiserver; :class:`hami_common.kube.KubeClient` is one."""


def placement_of(pod: Pod, booking: Booking, bind_time: datetime, config: ResourceConfig) -> PlacementDecision:
    """The bus message for a bound pod: containers as in the annotations, init containers first."""
    request = request_of(pod, config)
    names = [(c.name, True) for c in pod.spec.init_containers] + [(c.name, False) for c in pod.spec.containers]
    containers = []
    for i, (name, init) in enumerate(names):
        grants = booking.grants[i] if i < len(booking.grants) else ()
        req = request.containers[i] if i < len(request.containers) else None
        containers.append(
            ContainerPlacement(
                name=name,
                init=init,
                devices=tuple(
                    PlacedDevice(uuid=g.uuid, type=g.type, usedmem_mib=g.usedmem, usedcores=g.usedcores) for g in grants
                ),
                priority=req.priority if req is not None else None,
                mig=tuple(m for m in booking.mig if m.container_index == i),
            )
        )
    return PlacementDecision(
        pod_uid=pod.metadata.uid,
        namespace=pod.metadata.namespace,
        name=pod.metadata.name,
        node=booking.node,
        containers=tuple(containers),
        bind_time_ns=int(bind_time.timestamp() * 1e9),
    )


@dataclass(eq=False)
class _CacheFirst:
    """Node access whose first read is the watch cache's copy, which saves a GET per lock and unlock. The
    patch still carries that copy's resourceVersion, so a stale copy gets 409 and the retry reads the
    apiserver."""

    kube: NodePatcher
    cached: Node | None
    last: Node | None = None

    async def get_node(self, name: str) -> Node:
        node, self.cached = self.cached, None
        if node is None:
            node = await self.kube.get_node(name)
        self.last = node
        return node

    async def patch_node_annotations(
        self, name: str, changes: AnnotationChanges, *, resource_version: str = ""
    ) -> Node:
        if not changes and self.last is not None:
            return self.last  # nothing to change: no write
        return await self.kube.patch_node_annotations(name, changes, resource_version=resource_version)


@dataclass(eq=False)
class _Attempt:
    """How far one bind got: once the Binding is sent, its outcome is the apiserver's to tell."""

    posted: bool = False


@dataclass(eq=False)
class Binder:
    ledger: Ledger
    handoff: NodeHandoff
    kube: BindPort
    cached_pod: Callable[[str, str], Pod | None]
    cached_node: Callable[[str, str], Node | None]
    publisher: PlacementPublisher
    notices: NoticeQueue
    clock: Callable[[], datetime]
    resources: ResourceConfig = field(default_factory=ResourceConfig)
    handoff_wait: float = 10.0
    call_timeout: float = 10.0
    filter_times: FilterTimes = field(default_factory=FilterTimes)
    scheduler_name: str = DEFAULT_SCHEDULER_NAME  # binds only pods whose spec.schedulerName is this
    families: Families = field(default_factory=Families)  # every device family, the primary first
    _own_locks: dict[str, tuple[str, dict[str, str]]] = field(default_factory=dict)  # uid -> node, family locks
    _unlocks: asyncio.Queue[tuple[str, str, str]] = field(default_factory=asyncio.Queue)
    unlock_failures: int = 0
    unlocks_handled: int = 0  # ended holds whose lock annotation was removed, found gone, or failed to go
    _releasing: set[tuple[str, str]] = field(default_factory=set)  # holds ended, lock annotation not yet removed
    _bare: set[str] = field(default_factory=set)  # uids whose hold took no lock annotation (a bus-served node)
    _locks: dict[str, tuple[str, str]] = field(default_factory=dict)  # node -> the pod whose lock we wrote
    _seen: set[str] = field(default_factory=set)  # nodes whose watched copy has shown that lock

    # --- bind ------------------------------------------------------------------------------------------------

    async def bind(self, args: BindingArgs) -> None:
        """Bind the pod or raise a ``HamiError``.

        A failure undoes the reservation and the hold only of a pod known to be unbound. The booking of a
        pod that is bound must outlive every bind request that names it (a second bind, a bind elsewhere, a
        made-up pod name with its uid): dropped, its card would be offered again while the pod runs on it.
        """
        # A pod that cannot be read, or whose uid is not the one asked for, releases nothing: if it was
        # deleted, the watch releases its booking; the uid may be another, running pod's.
        pod = await self._pod(args)
        meta = pod.metadata
        uid = meta.uid
        if pod.spec.scheduler_name != self.scheduler_name:
            raise InvalidInput(
                f"pod {meta.namespace}/{meta.name} has schedulerName {pod.spec.scheduler_name!r}, "
                f"not {self.scheduler_name!r}: this extender binds only its own scheduler's pods"
            )
        if pod.spec.node_name:
            if pod.spec.node_name == args.node:
                return  # a repeated bind: the pod is where it was asked to be, and its hand-off stands
            raise Conflict(f"pod {meta.namespace}/{meta.name} is already bound to {pod.spec.node_name}")
        with tracer().start_as_current_span(
            spans.BIND, context=context_from_annotation(meta.annotations.get(TRACE_CONTEXT))
        ) as span:
            span.set_attribute(logkeys.POD_UID, uid)
            span.set_attribute(logkeys.NODE, args.node)
            started = time.perf_counter_ns()
            attempt = _Attempt()
            try:
                booking, bind_time, handoff_wait = await self._bind(pod, args.node, attempt)
            except (HamiError, TimeoutError) as err:
                own_locks = self._own_locks.pop(uid, None)
                if not attempt.posted and own_locks is not None:
                    await self._release_own_locks(*own_locks)
                if not attempt.posted:
                    # refused before the Binding was sent: the pod is as read, and unbound
                    if meta.annotations.get(BIND_PHASE) not in _BOUND_PHASES:
                        self.ledger.withdraw(uid)
                        self._end_hold(uid)
                elif await self._after_failed_post(pod, args.node):
                    return  # it is bound there after all (a 409 of a bind that landed before)
                message = str(err) or "timed out"
                self.notices.emit(reference_to(pod, "Pod"), "Warning", BINDING_FAILED, message)
                log.warning(
                    "bind of pod %s/%s to %s failed: %s",
                    meta.namespace,
                    meta.name,
                    args.node,
                    message,
                    extra={logkeys.POD_UID: uid, logkeys.NODE: args.node},
                )
                if isinstance(err, TimeoutError):
                    raise TransientError(f"bind of pod {meta.name} timed out") from err
                raise
            self._own_locks.pop(uid, None)
            self.notices.emit(
                reference_to(pod, "Pod"),
                "Normal",
                BINDING_SUCCEED,
                f"Successfully binding node [{args.node}] to {meta.namespace}/{meta.name}",
            )
            if booking is not None:
                decision = msgspec.structs.replace(
                    placement_of(pod, booking, bind_time, self.resources),
                    filter_ns=self.filter_times.take(uid),
                    bind_ns=time.perf_counter_ns() - started,
                    handoff_wait_ns=handoff_wait,
                )
                # a sibling of the message, not its parent: the node agent's spans continue the bind span
                place = tracer().start_span(spans.PLACE)
                try:
                    await self.publisher.publish(decision)
                finally:
                    place.end()

    async def _after_failed_post(self, pod: Pod, node: str) -> bool:
        """After the Binding failed (409, timeout): read the pod back and undo only what it shows to be ours
        to undo. True when the pod is bound to ``node`` after all, which is no failure."""
        meta = pod.metadata
        try:
            async with asyncio.timeout(self.call_timeout):
                now = await self.kube.get_pod(meta.namespace, meta.name)
        except (HamiError, TimeoutError):
            return False  # unknown: it may be bound; the booking and the hold stay until the watch tells
        if now.metadata.uid != meta.uid:
            return False  # deleted (and made again): the watch releases its booking and hold
        if now.spec.node_name == node:
            return True
        held = self.handoff.holder(node)
        if held is not None and held.uid == meta.uid:
            self._end_hold(meta.uid)  # the pod is not coming to this node: the hold this call took goes
        if not now.spec.node_name and now.metadata.annotations.get(BIND_PHASE) not in _BOUND_PHASES:
            self.ledger.withdraw(meta.uid)
        return False

    async def _pod(self, args: BindingArgs) -> Pod:
        pod = self.cached_pod(args.pod_namespace, args.pod_name)
        if pod is None or (args.pod_uid and pod.metadata.uid != args.pod_uid):
            async with asyncio.timeout(self.call_timeout):
                pod = await self.kube.get_pod(args.pod_namespace, args.pod_name)
        if args.pod_uid and pod.metadata.uid != args.pod_uid:
            raise Conflict(f"pod {args.pod_namespace}/{args.pod_name} has uid {pod.metadata.uid}, not {args.pod_uid}")
        return pod

    async def _bind(self, pod: Pod, node: str, attempt: _Attempt) -> tuple[Booking | None, datetime, int | None]:
        """Lock, mark and bind; returns the booking, the bind time and how long the hand-off waited (ns)."""
        meta = pod.metadata
        handoff_wait: int | None = None
        booking = self.ledger.booking(meta.uid)
        if booking is None:
            booking = booking_from(pod, self.families)
        if booking is None and request_of(pod, self.resources, self.families).has_devices:
            raise Conflict(f"pod {meta.namespace}/{meta.name} asks for GPUs but holds none: filter it first")
        if booking is not None and booking.node != node:
            raise Conflict(f"pod {meta.namespace}/{meta.name} was filtered to {booking.node}, not {node}")
        stale = self.handoff.elsewhere(meta.uid, node)
        if stale is not None:  # an earlier bind to another node ended in doubt; this one decides
            self._end_hold(meta.uid)
        if booking is not None and any(booking.grants[booking.init_count :]):
            by_family = self.families.split(booking.grants)
            served = self.families.handed_off(by_family)  # the cards our allocator serves
            ours = any(served[booking.init_count :])
            if ours:
                expected = sum(1 for g in served if g)
                waited = time.perf_counter_ns()
                await self.handoff.acquire(node, meta.uid, meta.namespace, meta.name, expected, self.handoff_wait)
                handoff_wait = time.perf_counter_ns() - waited
            cached = self.cached_node("", node)
            # HAMi's lock only where something reads it: a family sharing it, or a node whose side of a family
            # our allocator serves is HAMi's device plugin (it finds its pod through the lock). Our allocator
            # gets the placement over the bus and asks the kubelet which pod it admits; the in-memory hold
            # above still orders binds.
            shared, own = self.families.node_locks(by_family, over_bus=placed_over_bus(cached))
            annotate = shared
            if ours and not annotate:
                self._bare.add(meta.uid)
            taken: dict[str, str] = {}

            def lock(n: Node) -> AnnotationChanges:
                changes = self._lock_changes(n, pod) if annotate else {}
                for spec in own:
                    changes = {**changes, **self._own_lock_changes(n, spec)}
                taken.clear()
                taken.update({s.key: v for s in own if isinstance(v := changes.get(s.key), str)})
                return changes

            if own:
                self._own_locks[meta.uid] = (node, taken)
            if annotate:
                # noted before the write: the watch may show the new lock before the patch answers
                self._locks[node] = (meta.namespace, meta.name)
                self._seen.discard(node)
            async with asyncio.timeout(self.call_timeout):
                try:
                    await update_node_annotations(_CacheFirst(self.kube, cached), node, lock)
                except TransientError:
                    if cached is None:
                        raise
                    # the cached copy may show a lock whose removal it has not seen yet: ask the apiserver
                    await update_node_annotations(self.kube, node, lock)
        bind_time = self.clock()
        # HAMi patches these before binding; the Binding carries them instead, and the apiserver copies a
        # Binding's annotations onto the pod as it binds it: one round trip, and no "allocating" pod that
        # never got bound. So does the placement where Filter left it to the Binding (see Placer).
        placement = self.ledger.placement(meta.uid) if booking is not None else None
        marks = {**(placement or {}), BIND_PHASE: BIND_PHASE_ALLOCATING, BIND_TIME: encode_unix_seconds(bind_time)}
        attempt.posted = True
        async with asyncio.timeout(self.call_timeout):
            await self.kube.bind_pod(meta.namespace, meta.name, node, uid=meta.uid, annotations=marks)
        self.ledger.placed(meta.uid)
        return booking, bind_time, handoff_wait

    def _own_lock_changes(self, node: Node, spec: NodeLockSpec) -> AnnotationChanges:
        """A family's own lock (Cambricon's ``LockNode``): a bare RFC 3339 time; one younger than the
        family's expiry is another bind's, a later one is stale and replaced. An unreadable value is an
        AnnotationError, which fails the bind, as in HAMi."""
        now = self.clock()
        current = node.metadata.annotations.get(spec.key)
        if current and now - decode_rfc3339(current, spec.key) < spec.expiry:
            raise TransientError(
                f"node {node.metadata.name} has been locked within {spec.expiry.total_seconds():g}s ({spec.key})"
            )
        return {spec.key: encode_rfc3339(now)}

    async def _release_own_locks(self, node: str, taken: dict[str, str]) -> None:
        """Undo a failed bind's family locks (a merge-patch null), each only while it holds our value."""
        if not taken:
            return

        def changes(n: Node) -> AnnotationChanges:
            return {k: None for k, v in taken.items() if n.metadata.annotations.get(k) == v}

        try:
            async with asyncio.timeout(self.call_timeout):
                await update_node_annotations(self.kube, node, changes)
        except (HamiError, TimeoutError) as err:
            self.unlock_failures += 1
            log.warning("family lock of node %s not released: %s", node, err or "timeout", extra={logkeys.NODE: node})

    def _lock_changes(self, node: Node, pod: Pod) -> AnnotationChanges:
        """HAMi's LockNode: take a free, expired, own or orphaned lock; refuse a live lock of another pod."""
        meta = pod.metadata
        mine = encode_node_lock(NodeLock(locked_at=self.clock(), namespace=meta.namespace, name=meta.name))
        current = node.metadata.annotations.get(NODE_LOCK)
        if not current:
            return {NODE_LOCK: mine}
        try:
            lock = decode_node_lock(current)
        except AnnotationError:
            return {NODE_LOCK: mine}  # unreadable: HAMi treats it as expired
        if lock.held_by(meta.namespace, meta.name) or self.clock() - lock.locked_at >= timedelta(
            seconds=self.handoff.expiry
        ):
            return {NODE_LOCK: mine}
        if (lock.namespace, lock.name) in self._releasing:
            return {NODE_LOCK: mine}  # its hold has ended here; the annotation is only not removed yet
        holder = self.cached_pod(lock.namespace, lock.name) if lock.namespace else None
        settled = holder is not None and holder.metadata.annotations.get(BIND_PHASE) in (
            BIND_PHASE_SUCCESS,
            BIND_PHASE_FAILED,
        )
        if lock.namespace and (holder is None or settled):
            return {NODE_LOCK: mine}  # the holder is gone or done: take it over
        # Not Conflict: that would make the guarded write retry; a live lock of another pod is a "later".
        raise TransientError(
            f"node {node.metadata.name} has been locked within {self.handoff.expiry:g}s: node lock contention"
        )

    # --- ending holds ----------------------------------------------------------------------------------------

    def _end_hold(self, uid: str) -> None:
        hold = self.handoff.release(uid)
        if hold is not None and not self._took_no_lock(uid):
            self._unlock(hold.node, hold.namespace, hold.name)

    def _took_no_lock(self, uid: str) -> bool:
        """Whether the pod's hold was taken without HAMi's lock annotation (forgotten as it is asked)."""
        if uid in self._bare:
            self._bare.discard(uid)
            return True
        return False

    def _unlock(self, node: str, namespace: str, name: str) -> None:
        self._releasing.add((namespace, name))
        self._unlocks.put_nowait((node, namespace, name))

    def pod_done(self, uid: str) -> None:
        """The pod was deleted, finished, or its bind phase settled: its hold ends now."""
        self._end_hold(uid)

    def allocated(self, uid: str, ok: bool) -> None:
        """One AllocationResult from the bus."""
        hold = self.handoff.served(uid, ok)
        if hold is not None and not self._took_no_lock(uid):
            self._unlock(hold.node, hold.namespace, hold.name)

    def on_node(self, change: Change[Node]) -> None:
        """Watch handler: notes when a node we locked shows our lock, so its removal can be told apart from
        a copy that is merely older than our write."""
        node = change.obj
        holder = self._locks.get(node.metadata.name)
        if holder is None or node.metadata.name in self._seen:
            return
        value = node.metadata.annotations.get(NODE_LOCK)
        try:
            if value is not None and decode_node_lock(value).held_by(*holder):
                self._seen.add(node.metadata.name)
        except AnnotationError:
            return

    def _seen_lock(self, node: str, namespace: str, name: str) -> bool:
        if self._locks.get(node) != (namespace, name) or node not in self._seen:
            return False
        del self._locks[node]
        self._seen.discard(node)
        return True

    async def run_unlocks(self) -> None:
        """Remove HAMi's lock annotation of ended holds (owned by the lifespan)."""
        while True:
            node, namespace, name = await self._unlocks.get()

            def changes(n: Node, namespace: str = namespace, name: str = name) -> AnnotationChanges:
                value = n.metadata.annotations.get(NODE_LOCK)
                try:
                    held = value is not None and decode_node_lock(value).held_by(namespace, name)
                except AnnotationError:
                    held = False
                return {NODE_LOCK: None} if held else {}

            cached = self.cached_node("", node)
            shows_lock = cached is not None and bool(changes(cached))
            if not shows_lock and self._seen_lock(node, namespace, name):
                # the watch showed our lock and has since shown it gone: the allocator released it (as
                # HAMi's device plugin does after Allocate), or another scheduler took it over
                self._releasing.discard((namespace, name))
                self.unlocks_handled += 1
                continue
            # the cached copy serves only if it shows the lock: an older copy would find nothing to remove
            nodes = _CacheFirst(self.kube, cached if shows_lock else None)
            try:
                async with asyncio.timeout(self.call_timeout):
                    await update_node_annotations(nodes, node, changes)
            except NotFound:
                pass  # the node is gone, and its lock with it
            except (TransientError, Forbidden, Conflict, TimeoutError) as err:
                # kept in _releasing and tried again: a lock left behind would hold the node for the whole
                # hand-off expiry (HAMi's 5 minutes) once this process forgets it, e.g. after an apiserver
                # outage (a restarted apiserver answers 403 until its RBAC caches are filled)
                self.unlock_failures += 1
                log.warning(
                    "lock of node %s not released, retrying in %.1fs: %s",
                    node, UNLOCK_RETRY_S, err or "timeout", extra={logkeys.NODE: node},
                )  # fmt: skip
                asyncio.get_running_loop().call_later(UNLOCK_RETRY_S, self._unlocks.put_nowait, (node, namespace, name))
                continue
            except HamiError as err:  # refused for good: trying again would only repeat the refusal
                self.unlock_failures += 1
                log.warning("lock of node %s not released: %s", node, err, extra={logkeys.NODE: node})
            self._releasing.discard((namespace, name))
            self.unlocks_handled += 1
