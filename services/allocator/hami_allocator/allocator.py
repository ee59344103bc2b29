"""The plugin's decisions, free of gRPC: which answer a container gets, and which IDs to prefer.

``Allocate`` for one container with N device IDs: take the oldest staged pod whose next container asks for
N devices; without one, fall back to HAMi's way (the pending pod's annotation, :mod:`.pending`). Where the
kubelet's PodResources socket is configured, the pod is not guessed: only the pod the kubelet is admitting
(:mod:`.admitting`) is served, and only a container of it that waits for devices. Calls are
serialised (HAMi's ``applyMutex``): each one consumes a position in a pod's container order. The answer's
host files are written before it is returned; everything the apiserver and the bus must learn is handed
to :class:`.followup.FollowUp` and happens after the reply.

On a node in MIG mode a container granted MIG instances gets them created before the answer (:mod:`.mig`),
whichever path served it; the answer names the instances, and the follow-up writes their ids back into
``hami.io/vgpu-mig-allocations``. A staged entry that lacks the reservations (a placement from a scheduler
that did not send them) takes them from the pod's signed annotation, as the watch holds it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final, cast

import msgspec

from hami_allocator.admitting import Admitting, KubeletPods, SpecPod, admitting, ask_kubelet
from hami_allocator.followup import FollowUp, Served
from hami_allocator.inventory import GpuSource, VirtualDevice, virtual_devices
from hami_allocator.mig import MigInstances, Reclaimed
from hami_allocator.pending import BrokenPod, NodePods, PodLike, next_pending, next_uuids
from hami_common import logkeys, spans
from hami_common.allocation import (
    ContainerAllocation,
    ContainerResponse,
    NodeAllocationConfig,
    build_container,
    mig_answer,
    pair_mig,
)
from hami_common.annotations import MIG_ALLOCATIONS, decode_mig_allocations
from hami_common.errors import AnnotationError, HamiError, InvalidInput, NotFound, TransientError
from hami_common.grants import GrantKey, unverified_reason
from hami_common.inventory import MigNotPermitted, MigRefused
from hami_common.resources import GPU, GPU_PRIORITY
from hami_common.staging import Claim, ClaimOutcome, StagingStore, has_host_files, write_host_files
from hami_common.tracing import context_from_annotation, tracer

__all__ = ["Allocator", "GoneSet"]

log = logging.getLogger(__name__)

_GONE_KEEP: Final = 4096
_LATENCIES: Final = 1024


@dataclass(eq=False)
class GoneSet:
    """UIDs of pods known to be gone (deleted or terminated), newest kept; membership is all it answers."""

    keep: int = _GONE_KEEP
    _uids: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def add(self, uid: str) -> None:
        self._uids[uid] = None
        self._uids.move_to_end(uid)
        while len(self._uids) > self.keep:
            self._uids.popitem(last=False)

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids


class Allocator:
    def __init__(
        self,
        node: str,
        *,
        store: StagingStore,
        config: NodeAllocationConfig,
        inventory: GpuSource,
        split: int,
        followup: FollowUp,
        pods: NodePods | None = None,
        fallback_timeout: float = 10.0,
        grant_key: GrantKey | None = None,
        priority_name: str = GPU_PRIORITY,
        mig: MigInstances | None = None,
        resource: str = GPU,
        kubelet_pods: KubeletPods | None = None,
    ) -> None:
        if split < 1:
            raise ValueError("device split count must be at least 1")
        self.node = node
        self.store = store
        self.config = config
        self.inventory = inventory
        self.split = split
        self.followup = followup
        self.pods = pods
        self.fallback_timeout = fallback_timeout
        self.grant_key = grant_key  # None: no annotation-only allocation is served (fail closed)
        self.priority_name = priority_name  # resourcePriorityName of the device config
        self.known_pods: Callable[[], Iterable[PodLike]] = tuple  # the node's pods, as a watch holds them
        # Whether ``known_pods`` is complete (a watch has synced): until then, and without a watch (staged-only
        # operation), no MIG instance is judged unowned: who owns what cannot be told.
        self.known_pods_synced: Callable[[], bool] = lambda: False
        self.gone = GoneSet()
        self.pod_ended = GoneSet()  # deleted or Succeeded/Failed: their MIG instances may go (not merely deleting)
        self.mig = mig  # None: this node is not in MIG mode
        self.resource = resource  # the extended resource this plugin advertises
        # the kubelet's PodResources List; None: the pod an Allocate is for is guessed, as HAMi guesses it
        self.kubelet_pods = kubelet_pods
        self.refused_unknown = 0  # Allocate calls refused because the pod they are for could not be told
        # Names of the containers served per pod, kept until the pod is gone: whether a pod listing shows an
        # entry erased or not yet, a served container is never offered again.
        self.inflight: dict[str, set[str]] = {}
        self.served_staged = 0
        self.served_fallback = 0
        # Recent in-plugin latencies of answered containers, in ms, by path: what a metric or a benchmark reads.
        self.latencies_ms: dict[bool, deque[float]] = {True: deque(maxlen=_LATENCIES), False: deque(maxlen=_LATENCIES)}
        self._lock = asyncio.Lock()
        self._devices: tuple[int, dict[str, VirtualDevice]] = (0, {})

    # --- devices -----------------------------------------------------------------------------------------

    def devices(self) -> dict[str, VirtualDevice]:
        """The advertised virtual devices by ID, for the inventory's current version."""
        snapshot = self.inventory.snapshot()
        if self._devices[0] != snapshot.version:
            devs = virtual_devices(snapshot.gpus, self.split)
            self._devices = (snapshot.version, {d.id: d for d in devs})
        return self._devices[1]

    def check_ids(self, ids: Sequence[str]) -> None:
        if not ids:
            raise InvalidInput("a container request names no device IDs")
        known = self.devices()
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise InvalidInput(f"unknown device IDs {unknown[:8]} (this plugin advertises {len(known)} devices)")
        if len(set(ids)) != len(ids):
            raise InvalidInput(f"device IDs repeated in one request: {sorted(ids)}")

    # --- gone pods, erased entries -------------------------------------------------------------------------

    def forget(self, uid: str) -> None:
        """The pod is gone: never serve it, forget which of its containers were served."""
        self.gone.add(uid)
        self.inflight.pop(uid, None)

    def ended(self, uid: str) -> None:
        """The pod's containers are over (deleted, or Succeeded/Failed): its MIG instances may be destroyed."""
        self.forget(uid)
        self.pod_ended.add(uid)

    async def reclaim_mig(self) -> list[Reclaimed]:
        """Destroy the MIG instances no live pod owns (:meth:`.mig.MigInstances.reclaim`); serialised with
        Allocate, so an instance is never judged between its creation and its record."""
        if self.mig is None:
            return []
        async with self._lock:
            return await self._reclaim_locked(self.mig)

    async def _reclaim_locked(self, mig: MigInstances) -> list[Reclaimed]:
        if not self.known_pods_synced():
            return []
        return await asyncio.to_thread(mig.reclaim, list(self.known_pods()), self.pod_ended)

    # --- Allocate ----------------------------------------------------------------------------------------

    def _claim(self, count: int, only: Admitting | None = None) -> ClaimOutcome:
        """A staged claim whose container the fallback has not served already.

        The node agent may stage a placement moments after the fallback answered for that pod; served as is,
        the stale entry would hand those devices to the next pod. Each claim advances its entry, so
        discarding such claims ends.
        """
        problems: list[str] = []
        while True:
            outcome = self.store.claim(count, gone=self.gone, pod_uid=only.uid if only is not None else None)
            problems.extend(outcome.problems)
            claim = outcome.claim
            if claim is None or claim.container.name not in self.inflight.get(claim.pod.pod_uid, ()):
                return dataclasses.replace(outcome, problems=tuple(problems))
            log.info(
                "staged entry of %s/%s container %s was already served by the fallback; skipped",
                claim.pod.namespace, claim.pod.name, claim.container.name, extra={logkeys.POD_UID: claim.pod.pod_uid},
            )  # fmt: skip

    async def allocate(self, ids: Sequence[str]) -> tuple[ContainerAllocation, Served]:
        """The answer for one container request; raises InvalidInput, NotFound or TransientError.

        The caller hands the returned :class:`Served` to :meth:`follow_up` once the reply is on its way, so
        the apiserver writes do not compete with sending it.
        """
        started = time.time_ns()
        self.check_ids(ids)
        async with self._lock:
            who = await self._admitting() if self.kubelet_pods is not None else None
            outcome = self._claim(len(ids), who)
            if outcome.claim is not None:
                claim = outcome.claim
                allocation = claim.container
                served = Served(
                    pod_uid=claim.pod.pod_uid,
                    namespace=claim.pod.namespace,
                    name=claim.pod.name,
                    container=allocation.name,
                    device_uuids=allocation.device_uuids,
                    staged=True,
                    trace_context=claim.pod.trace_context,
                )
            else:
                allocation, served = await self._fallback(len(ids), outcome.problems, who)
            if who is not None and served.container not in who.waiting:
                self.refused_unknown += 1
                raise InvalidInput(
                    f"the grant of pod {who.what} is for container {served.container}, but the kubelet is not "
                    f"allocating that container (waiting: {', '.join(sorted(who.waiting))}); nothing handed out"
                )
            if self.mig is not None and outcome.claim is not None and not allocation.mig:
                if not self.mig.modes_known(allocation.device_uuids):  # a driver call per GPU, once
                    await asyncio.to_thread(self.mig.learn_modes, allocation.device_uuids)
                allocation = self._staged_reservations(outcome.claim, self.mig)
            if allocation.mig:
                allocation = await self._realise(served, allocation)
                served = dataclasses.replace(served, mig=allocation.mig)
            if outcome.claim is None:
                self.served_fallback += 1
            else:
                self.served_staged += 1
            try:
                if not has_host_files(allocation):  # staged entries come with them; the fallback writes them
                    write_host_files(allocation)
            except OSError as err:
                # Not counted as served: the annotation entry stays, and the kubelet's retry takes the fallback.
                raise TransientError(f"cannot prepare host files of container {allocation.name}: {err}") from err
            self.inflight.setdefault(served.pod_uid, set()).add(served.container)
        self.followup.expect()
        elapsed_ns = time.time_ns() - started
        self.latencies_ms[served.staged].append(elapsed_ns / 1e6)
        return allocation, dataclasses.replace(served, started_ns=started, allocate_ns=elapsed_ns)

    async def _realise(self, served: Served, allocation: ContainerAllocation) -> ContainerAllocation:
        """Create the container's MIG instances and complete its answer. A refusal may come from an instance
        nobody owns any more (its pod ended while this plugin was away): reclaim, then try once more."""
        if self.mig is None:
            raise InvalidInput(
                f"pod {served.namespace}/{served.name} container {allocation.name} was granted MIG instances, "
                f"but node {self.node} is not in MIG mode"
            )
        mig = self.mig
        try:
            try:
                made = await asyncio.to_thread(mig.realise, served.pod_uid, allocation.mig)
            except MigNotPermitted:
                raise
            except MigRefused:
                await self._reclaim_locked(mig)
                made = await asyncio.to_thread(mig.realise, served.pod_uid, allocation.mig)
        except MigNotPermitted as err:
            # A deployment fault (the container lacks MIG privileges): INTERNAL, not UNAVAILABLE, since no retry
            # helps until the operator grants them; the message says what is missing.
            raise HamiError(f"pod {served.namespace}/{served.name} container {allocation.name}: {err}") from err
        except MigRefused as err:
            # Not counted as served: the annotation entry stays, and the kubelet's retry takes the fallback.
            raise TransientError(
                f"pod {served.namespace}/{served.name} container {allocation.name}: the driver refused a MIG "
                f"instance: {err}"
            ) from err
        return mig_answer(allocation, made, self.config)

    def _staged_reservations(self, claim: Claim, mig: MigInstances) -> ContainerAllocation:
        """A staged entry without MIG reservations, for GPUs in MIG mode: the placement did not carry them,
        so they come from the pod's annotation, as the watch holds it and only if the scheduler signed it."""
        allocation = claim.container
        if not any(mig.in_mig_mode(u) for u in allocation.device_uuids):
            return allocation
        what = f"pod {claim.pod.namespace}/{claim.pod.name} container {allocation.name}"
        pod = next((p for p in self.known_pods() if p.metadata.uid == claim.pod.pod_uid), None)
        if pod is None:
            raise TransientError(f"{what} is on MIG GPUs and its reservations are not known yet")
        annotations = pod.metadata.annotations
        refused = unverified_reason(self.grant_key, pod.metadata.uid, annotations)
        if refused or MIG_ALLOCATIONS not in annotations:
            raise InvalidInput(f"{what} is on MIG GPUs without a usable reservation: {refused or 'none'}")
        names = [c.name for c in (*pod.spec.init_containers, *pod.spec.containers)]
        if allocation.name not in names:
            raise InvalidInput(f"{what}: the pod has no such container")
        index = names.index(allocation.name)
        try:
            reservations = [
                m for m in decode_mig_allocations(annotations[MIG_ALLOCATIONS]) if m.container_index == index
            ]
        except AnnotationError as err:
            raise InvalidInput(f"{what}: {err}") from err
        paired = pair_mig(
            f"{claim.pod.namespace}/{claim.pod.name}", allocation.name, allocation.device_uuids, reservations
        )
        if not paired:
            raise InvalidInput(f"{what} is on MIG GPUs but has no MIG reservation")
        return msgspec.structs.replace(
            allocation,
            response=ContainerResponse(envs={}),
            cache_dir="",
            limits_host_path="",
            limits_content="",
            mig=paired,
        )

    def follow_up(self, served: Served) -> None:
        """Record the span and log line of a served container, and hand it to the follow-up worker.

        Called once its reply is sent: neither the span nor the log line is something the kubelet waits for.
        """
        self._trace(served)
        self.followup.submit(served, expected=True)

    async def _admitting(self) -> Admitting:
        """The pod the kubelet is admitting, from its PodResources List and the node's pods (the watch's,
        else one listing from the apiserver for pods the watch does not hold yet). Fails closed."""
        assert self.kubelet_pods is not None
        try:
            listed = await ask_kubelet(self.kubelet_pods, self.fallback_timeout)
        except TransientError:
            self.refused_unknown += 1
            raise
        # the watch holds the shared Pod, whose containers carry their resources as SpecPod's do
        known: dict[tuple[str, str], SpecPod] = {
            (p.metadata.namespace, p.metadata.name): cast(SpecPod, p) for p in self.known_pods()
        }
        if self.pods is not None and any((e.namespace, e.name) not in known for e in listed):
            try:
                async with asyncio.timeout(self.fallback_timeout):
                    for pod in await self.pods.list_node_pods(self.node):
                        known.setdefault((pod.metadata.namespace, pod.metadata.name), pod)
            except (HamiError, TimeoutError) as err:
                log.info("listing the pods of node %s for the kubelet's pods failed: %s", self.node, err)
        try:
            return admitting(listed, known, self.resource, self.node)
        except NotFound:
            self.refused_unknown += 1
            raise

    async def _fallback(
        self, count: int, problems: Sequence[str], only: Admitting | None = None
    ) -> tuple[ContainerAllocation, Served]:
        also = f"; {'; '.join(problems)}" if problems else ""
        if self.pods is None:
            raise NotFound(f"nothing staged for {count} device(s) on node {self.node} and no apiserver{also}")
        try:
            async with asyncio.timeout(self.fallback_timeout):
                pods = await self.pods.list_node_pods(self.node)
        except TimeoutError as err:
            raise TransientError(f"listing the pods of node {self.node} timed out{also}") from err
        whose = ""
        if only is not None:
            pods = [p for p in pods if p.metadata.uid == only.uid]
            whose = f"pod {only.what}, which the kubelet is admitting, holds no grant on node {self.node}: "
        try:
            pending = next_pending(
                pods,
                self.node,
                count,
                inflight=self.inflight,
                gone=self.gone,
                key=self.grant_key,
                priority_name=self.priority_name,
            )
        except NotFound as err:
            raise NotFound(f"{whose}{err}{also}") from err
        except BrokenPod as err:
            meta = err.pod.metadata
            self.followup.submit(
                Served(
                    pod_uid=meta.uid,
                    namespace=meta.namespace,
                    name=meta.name,
                    container="",
                    device_uuids=(),
                    staged=False,
                    failure=str(err),
                )
            )
            raise
        meta = pending.pod.metadata
        allocation = build_container(meta.uid, pending.grant, self.config)
        self.store.skip(meta.uid)  # a staged entry of this pod, if any, must not serve this container again
        served = Served(
            pod_uid=meta.uid,
            namespace=meta.namespace,
            name=meta.name,
            container=allocation.name,
            device_uuids=allocation.device_uuids,
            staged=False,
            trace_context=pending.trace_context,
        )
        return allocation, served

    def _trace(self, served: Served) -> None:
        ctx = context_from_annotation(served.trace_context) if served.trace_context else None
        span = tracer().start_span(spans.ALLOCATE, context=ctx, start_time=served.started_ns)
        span.set_attribute(logkeys.POD_UID, served.pod_uid)
        span.set_attribute(logkeys.NODE, self.node)
        span.set_attribute("staged", served.staged)
        span.end(end_time=served.started_ns + (served.allocate_ns or 0) if served.started_ns else None)
        log.info(
            "allocated %s/%s container %s: %s (%s)",
            served.namespace,
            served.name,
            served.container,
            ",".join(served.device_uuids),
            "staged" if served.staged else "fallback",
            extra={logkeys.POD_UID: served.pod_uid},
        )

    # --- GetPreferredAllocation ------------------------------------------------------------------------------

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int) -> list[str]:
        """IDs of the physical GPUs the next container was granted, then the kubelet's own order.

        Advisory only (the answer's UUIDs come from the placement, not from these IDs). The grant is read from
        the staged answer, else from the pods the plugin's watch holds (``known_pods``): never the apiserver.
        """
        devices = self.devices()
        chosen = list(dict.fromkeys(must_include))
        peeked = self.store.peek(size, gone=self.gone)
        if peeked is not None:
            wanted: Sequence[str] = peeked.container.device_uuids
        else:
            wanted = next_uuids(
                self.known_pods(), self.node, size, inflight=self.inflight, gone=self.gone, key=self.grant_key
            )
        for uuid in wanted:
            if len(chosen) >= size:
                break
            match = next((i for i in available if i not in chosen and devices.get(i, _NONE).uuid == uuid), None)
            if match is not None:
                chosen.append(match)
        for i in available:
            if len(chosen) >= size:
                break
            if i not in chosen:
                chosen.append(i)
        return chosen


_NONE: Final = VirtualDevice(id="", uuid="", healthy=False, numa=None)
