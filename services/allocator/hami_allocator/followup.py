"""What the plugin does after it has answered ``Allocate``, off the reply's critical path.

For each served container, in the order they were served (one worker, FIFO), as HAMi's plugin does
(hami-protocol §2.5, §5.4 steps 5-7, §4.11):

1. erase that container's entry from ``hami.io/vgpu-devices-to-allocate`` (pop the first non-empty entry,
   re-encode, resourceVersion-guarded merge patch, retried on conflict). The first try works on the copy
   of the pod that the plugin's watch holds, so a current copy costs one request; a stale one is refused
   by the apiserver and the pod is read again. Conflicts are common here and not contention: the kubelet
   reports the pod's status just as this runs. So a refused write is retried on a fresh read at once,
   not after the usual backoff;
   A MIG container's instances are recorded in the same guarded patch: each of its reservations in
   ``hami.io/vgpu-mig-allocations`` gains ``migUUID``, ``gpuInstanceID`` and ``computeInstanceID``, the rest
   of the annotation as the pod holds it (hami-protocol §2.6, §5.4);
2. when no entry is left, set ``hami.io/bind-phase`` to ``success`` in the same patch and release the node
   lock ``hami.io/mutex.lock`` if this pod holds it (first on the node as the plugin's watch holds it, as
   with the pod); on a failed allocation, set ``failed`` and release;
3. publish an :class:`AllocationResult` on ``hami.allocated.<node>`` (when a bus is connected).

Without an apiserver (staged-only operation) steps 1-2 are skipped; without a bus, step 3 is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Protocol

import msgspec
from opentelemetry.context import Context

from hami_common import logkeys, subjects
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_FAILED,
    BIND_PHASE_SUCCESS,
    DEVICES_TO_ALLOCATE,
    MIG_ALLOCATIONS,
    NODE_LOCK,
    NODE_PLACEMENTS,
    NODE_PLACEMENTS_BUS,
    VGPU_NODE,
    MigAllocation,
    decode_mig_allocations,
    decode_node_lock,
    decode_pod_devices,
    encode_mig_allocations,
    encode_pod_devices,
    pop_first_container,
)
from hami_common.errors import AnnotationError, Conflict, Forbidden, HamiError, NotFound, TransientError
from hami_common.events import AllocationResult
from hami_common.kube import (
    AnnotationChanges,
    Backoff,
    Node,
    NodePatcher,
    Pod,
    PodGuardedPatcher,
    PodPatcher,
    PodReader,
    guarded_annotation_patch,
    retry_on_conflict,
)
from hami_common.tracing import context_from_annotation

__all__ = ["FollowUp", "PodAccess", "ResultPublisher", "Served", "release_node_lock", "with_runtime_ids"]

log = logging.getLogger(__name__)

_ATTEMPTS: Final = 5
# Another field's writer (pod status, node annotations) made the copy stale, nobody competes for ours: read
# again almost at once, with a little growing jitter should the same writer be at it again.
_CONFLICT_BACKOFF: Final = Backoff(initial=0.002, cap=0.05)
_WRITTEN_KEPT: Final = 256  # pods with containers still to erase, whose last write is kept (see _remember)
_RETRY_DELAY_S: Final = 0.2
_RETRY_CAP_S: Final = 2.0
PATIENCE_S: Final = 300.0  # HAMi's node-lock expiry


@dataclass(frozen=True, slots=True)
class Served:
    """One container answered (or refused) by ``Allocate``."""

    pod_uid: str
    namespace: str
    name: str
    container: str
    device_uuids: tuple[str, ...]
    staged: bool
    trace_context: str = ""
    failure: str = ""  # non-empty: the allocation of this pod failed (bind-phase failed)
    started_ns: int | None = None  # when the plugin took the request (epoch ns)
    allocate_ns: int | None = None  # how long the plugin took to answer
    mig: tuple[MigAllocation, ...] = ()  # the MIG instances created for the container, runtime ids set


def with_runtime_ids(value: str | None, realised: tuple[MigAllocation, ...]) -> tuple[str | None, list[str]]:
    """``hami.io/vgpu-mig-allocations`` with the runtime ids of ``realised`` filled into the entries they
    realise (same container, device, GPU, profile and placement); other entries stay as they are. Returns
    the new value (None: nothing to write) and the reservations that found no entry."""
    if not realised:
        return None, []
    current = decode_mig_allocations(value) if value is not None else ()
    ids = {(m.container_index, m.device_index, m.gpu_uuid, m.profile, m.placement): m for m in realised}
    found: set[tuple[object, ...]] = set()
    updated = []
    for entry in current:
        key = (entry.container_index, entry.device_index, entry.gpu_uuid, entry.profile, entry.placement)
        made = ids.get(key)
        if made is not None:
            found.add(key)
            entry = msgspec.structs.replace(
                entry,
                mig_uuid=made.mig_uuid,
                gpu_instance_id=made.gpu_instance_id,
                compute_instance_id=made.compute_instance_id,
            )
        updated.append(entry)
    missing = [f"{m.gpu_uuid} {m.profile}@{m.placement.start}" for k, m in ids.items() if k not in found]
    return (encode_mig_allocations(updated) if found else None), missing


class PodAccess(PodReader, PodPatcher, PodGuardedPatcher, Protocol):
    pass


class ResultPublisher(Protocol):
    async def publish(self, subject: str, event: msgspec.Struct, *, ctx: Context | None = None) -> None: ...


def _lock_free_node(node: Node, namespace: str, name: str) -> bool:
    """A node our node agent marked as served over the bus, whose copy shows no lock of this pod."""
    annotations = node.metadata.annotations
    if annotations.get(NODE_PLACEMENTS) != NODE_PLACEMENTS_BUS:
        return False
    value = annotations.get(NODE_LOCK)
    try:
        return value is None or not decode_node_lock(value).held_by(namespace, name)
    except AnnotationError:
        return True


async def release_node_lock(
    nodes: NodePatcher, node: str, namespace: str, name: str, *, known: Node | None = None
) -> bool:
    """Remove ``hami.io/mutex.lock`` if ``namespace/name`` holds it; True if it was released.

    ``known``, the node as a watch holds it, is tried first and spares a read when it is current and shows
    this pod's lock; otherwise (no lock there, another holder, or a 409 because it is stale) the node is read.
    """

    async def read() -> Node:
        return await nodes.get_node(node)

    async def write(current: Node) -> bool:
        value = current.metadata.annotations.get(NODE_LOCK)
        if value is None:
            return False
        try:
            if not decode_node_lock(value).held_by(namespace, name):
                return False
        except AnnotationError:
            return False
        await nodes.patch_node_annotations(node, {NODE_LOCK: None}, resource_version=current.metadata.resource_version)
        return True

    if known is not None:
        with contextlib.suppress(Conflict):
            if await write(known):
                return True
    return (await retry_on_conflict(read, write, attempts=_ATTEMPTS, backoff=_CONFLICT_BACKOFF)).value


class FollowUp:
    """The worker; :meth:`submit` never blocks, :meth:`run` processes until cancelled."""

    def __init__(
        self,
        node: str,
        *,
        pods: PodAccess | None = None,
        nodes: NodePatcher | None = None,
        publisher: ResultPublisher | None = None,
        on_erased: Callable[[str], None] = lambda uid: None,
        clock: Callable[[], int] = time.time_ns,
        known_pod: Callable[[str, str], Pod | None] = lambda namespace, name: None,
        known_node: Callable[[], Node | None] = lambda: None,
        patience: float = PATIENCE_S,
    ) -> None:
        self.node = node
        self.patience = patience  # how long a follow-up waits for an apiserver that is away
        self.pods = pods
        # The pod and the node as this plugin's watches hold them: first tries that read nothing more.
        self.known_pod = known_pod
        self.known_node = known_node
        self.nodes = nodes
        self.publisher = publisher
        self.on_erased = on_erased
        self.clock = clock
        self.failures = 0
        self._queue: asyncio.Queue[Served] = asyncio.Queue()
        self._outstanding = 0  # expected or queued, not yet followed up
        self._written: dict[str, Pod] = {}  # uid -> the pod as last written, while containers remain
        self._idle = asyncio.Event()
        self._idle.set()

    def expect(self) -> None:
        """Announce a :meth:`submit` that will come a little later (once the reply is sent)."""
        self._outstanding += 1
        self._idle.clear()

    def submit(self, served: Served, *, expected: bool = False) -> None:
        if not expected:
            self.expect()
        self._queue.put_nowait(served)

    async def join(self) -> None:
        """Wait until everything served so far, announced or submitted, has been followed up."""
        await self._idle.wait()

    async def run(self) -> None:
        while True:
            served = await self._queue.get()
            try:
                await self._follow(served)
            except HamiError as err:
                self.failures += 1
                log.warning(
                    "follow-up of %s/%s container %s failed: %s",
                    served.namespace,
                    served.name,
                    served.container,
                    err,
                    extra={logkeys.POD_UID: served.pod_uid},
                )
            finally:
                self._queue.task_done()
                self._outstanding -= 1
                if self._outstanding == 0:
                    self._idle.set()

    async def _follow(self, served: Served) -> None:
        if self.pods is not None:
            # The record is the source of truth (bind-phase, the lock) and the allocation result follows it, so
            # an apiserver that is away (a restart takes seconds) is waited for, up to the hand-off expiry after
            # which the scheduler takes the node over anyway; later pods' follow-ups would fail meanwhile too.
            deadline = time.monotonic() + self.patience
            delay = _RETRY_DELAY_S
            while True:
                try:
                    await self._record(served, self.pods)
                    break
                except (TransientError, Forbidden) as err:  # Forbidden: a restarted apiserver's first moments
                    if time.monotonic() + delay > deadline:
                        raise
                    if delay == _RETRY_DELAY_S:
                        log.info(
                            "follow-up of %s/%s waits for the apiserver: %s", served.namespace, served.name, err,
                            extra={logkeys.POD_UID: served.pod_uid},
                        )  # fmt: skip
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _RETRY_CAP_S)
        if self.publisher is not None:
            result = AllocationResult(
                pod_uid=served.pod_uid,
                namespace=served.namespace,
                name=served.name,
                node=self.node,
                container=served.container,
                ok=not served.failure,
                staged=served.staged,
                device_uuids=served.device_uuids,
                reason=served.failure,
                at_ns=self.clock(),
                allocate_ns=served.allocate_ns,
                mig=served.mig,
            )
            ctx = context_from_annotation(served.trace_context) if served.trace_context else None
            await self.publisher.publish(subjects.allocated(self.node), result, ctx=ctx)

    async def _record(self, served: Served, pods: PodAccess) -> None:
        if served.failure:
            await pods.patch_pod_annotations(served.namespace, served.name, {BIND_PHASE: BIND_PHASE_FAILED})
            await self._release(served)
            return
        done = False

        async def read() -> Pod:
            return await pods.get_pod(served.namespace, served.name)

        async def write(pod: Pod) -> Pod:
            nonlocal done
            if pod.metadata.uid != served.pod_uid:
                raise NotFound(f"pod {served.namespace}/{served.name} was replaced by another of the same name")
            current = decode_pod_devices(pod.metadata.annotations.get(DEVICES_TO_ALLOCATE, ""))
            popped, rest = pop_first_container(current)
            done = not any(rest)
            changes: AnnotationChanges = {DEVICES_TO_ALLOCATE: encode_pod_devices(rest)}
            try:
                mig_value, unmatched = with_runtime_ids(pod.metadata.annotations.get(MIG_ALLOCATIONS), served.mig)
            except AnnotationError as err:  # the erasure must still happen; the ids are lost, the instances not
                mig_value, unmatched = None, [str(err)]
            if mig_value is not None:
                changes = {**changes, MIG_ALLOCATIONS: mig_value}
            if done:
                changes = {**changes, BIND_PHASE: BIND_PHASE_SUCCESS}
            # Conditional on the values this pop was computed from, not on the whole pod: the kubelet's status
            # writes in between would otherwise refuse it (a 409 and a read per pod). The label HAMi's monitor
            # selects on is added where the Binding brought the placement (a Binding carries no labels).
            labels = {VGPU_NODE: self.node} if pod.metadata.labels.get(VGPU_NODE) != self.node else None
            patched = await pods.patch_pod_guarded(
                served.namespace,
                served.name,
                guarded_annotation_patch(
                    pod.metadata.annotations,
                    uid=pod.metadata.uid,
                    resource_version=pod.metadata.resource_version,
                    guards=(DEVICES_TO_ALLOCATE, MIG_ALLOCATIONS) if mig_value is not None else (DEVICES_TO_ALLOCATE,),
                    changes=changes,
                    labels=labels,
                    read_labels=pod.metadata.labels,
                ),
            )
            if unmatched:
                log.warning(
                    "pod %s/%s: MIG instances %s match no reservation in %s; their ids are not recorded",
                    served.namespace, served.name, unmatched, MIG_ALLOCATIONS,
                    extra={logkeys.POD_UID: served.pod_uid},
                )  # fmt: skip
            if tuple(d.uuid for d in popped) != served.device_uuids:  # told once written: a refused try says nothing
                log.warning(
                    "pod %s/%s: erased entry %s differs from the devices served (%s)",
                    served.namespace,
                    served.name,
                    [d.uuid for d in popped],
                    list(served.device_uuids),
                    extra={logkeys.POD_UID: served.pod_uid},
                )
            return patched

        try:
            written = await self._write_known(served, write)
            if written is None:
                written = (await retry_on_conflict(read, write, attempts=_ATTEMPTS, backoff=_CONFLICT_BACKOFF)).value
        except NotFound:
            self._written.pop(served.pod_uid, None)
            self.on_erased(served.pod_uid)
            return  # the pod is gone: nothing to erase
        self._remember(served.pod_uid, None if done else written)
        self.on_erased(served.pod_uid)
        if done:
            await self._release(served)

    def _remember(self, uid: str, pod: Pod | None) -> None:
        """Keep the pod as this worker last wrote it while containers of it remain to be erased: the next
        one's pop starts from it, not from a watch copy that may not show this write yet."""
        self._written.pop(uid, None)
        if pod is not None:
            self._written[uid] = pod
            while len(self._written) > _WRITTEN_KEPT:
                del self._written[next(iter(self._written))]

    async def _write_known(self, served: Served, write: Callable[[Pod], Awaitable[Pod]]) -> Pod | None:
        """``write`` on the copy of the pod this worker last wrote, or else the watch's, sparing a read; None
        when there is no such copy or it is behind the apiserver's (a conflict, so nothing was written)."""
        known = self._written.get(served.pod_uid) or self.known_pod(served.namespace, served.name)
        if known is None or known.metadata.uid != served.pod_uid:
            return None
        try:
            return await write(known)
        except Conflict:
            return None

    async def _release(self, served: Served) -> None:
        known = self.known_node()
        if known is not None and _lock_free_node(known, served.namespace, served.name):
            return  # the scheduler binds here without HAMi's lock (our node agent's marker): nothing to read
        if self.nodes is not None and await release_node_lock(
            self.nodes, self.node, served.namespace, served.name, known=known
        ):
            log.info(
                "released the node lock held by %s/%s",
                served.namespace,
                served.name,
                extra={logkeys.POD_UID: served.pod_uid},
            )
