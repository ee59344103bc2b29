"""A stand-in for kube-scheduler configured with our extender: ``/filter`` then ``/bind``, as it calls them.

kube-scheduler with ``nodeCacheCapable: true`` sends ``ExtenderArgs`` with the pod and the candidate node
names, takes a node from the answer, and, since the extender owns ``bindVerb``, asks it to bind. This
driver does the same for every pod whose ``schedulerName`` is ours and that has no node yet: one
scheduling cycle at a time (filters are sequential, as in kube-scheduler), binds in the background. A
pod that fits nowhere, or whose filter fails, stays pending: the driver records a ``FailedScheduling`` Event
with the reasons (or the error) and tries again after a per-pod backoff that doubles from 1 s up to 10 s, as
kube-scheduler's backoff queue does (podInitialBackoffSeconds, podMaxBackoffSeconds); an update of the pod
does not cut the backoff short. So a pod that can never be placed costs a bounded number of calls, Events
(which the recorder aggregates) and log lines per minute.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Final, TypeVar

import msgspec

from hami_common.kube import (
    Change,
    EventRecorder,
    KubeClient,
    Node,
    Pod,
    WatchCache,
    node_source,
    pod_source,
    reference_to,
)
from hami_common.scheduling import DEFAULT_SCHEDULER_NAME
from hami_sim.http import HttpClient, HttpError
from hami_sim.tls import TlsFiles

__all__ = ["FAILED_SCHEDULING", "ExtenderArgs", "FilterResult", "SchedulerDriver", "Verdict"]

log = logging.getLogger(__name__)
R = TypeVar("R")

FILTER_PATH: Final = "/filter"
BIND_PATH: Final = "/bind"
DEFAULT_SCHEDULER: Final = DEFAULT_SCHEDULER_NAME
NO_NODES: Final = "no nodes available to schedule pods"
FAILED_SCHEDULING: Final = "FailedScheduling"  # the Event reason kube-scheduler records for a pod left pending
_HTTP_TIMEOUT_S: Final = 30.0  # HAMi's chart: httpTimeout 30s
INITIAL_BACKOFF_S: Final = 1.0  # kube-scheduler's podInitialBackoffSeconds
MAX_BACKOFF_S: Final = 10.0  # kube-scheduler's podMaxBackoffSeconds


class ExtenderArgs(msgspec.Struct, frozen=True):
    Pod: msgspec.Raw
    Nodes: None = None
    NodeNames: list[str] | None = None


class FilterResult(msgspec.Struct, frozen=True):
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] | None = None
    FailedAndUnresolvableNodes: dict[str, str] | None = None
    Error: str = ""


class BindingArgs(msgspec.Struct, frozen=True):
    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class BindingResult(msgspec.Struct, frozen=True):
    Error: str = ""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Where a pod stands after its latest scheduling cycle."""

    node: str = ""  # bound here
    reasons: Mapping[str, str] = field(default_factory=dict)  # node -> why not, when it fits nowhere
    error: str = ""  # the extender's or transport's error, retried


def unschedulable_message(reasons: Mapping[str, str], total: int) -> str:
    """kube-scheduler's wording: ``0/N nodes are available: <reason per node>``."""
    detail = ", ".join(f"{node}: {why}" for node, why in sorted(reasons.items()))
    return f"0/{total} nodes are available: {detail}."


class SchedulerDriver:
    """Schedules our pods through an extender's HTTP API until :meth:`run` is cancelled."""

    def __init__(
        self,
        kube: KubeClient,
        extender_url: str,
        *,
        scheduler_name: str = DEFAULT_SCHEDULER,
        retry_after: float = INITIAL_BACKOFF_S,
        max_backoff: float = MAX_BACKOFF_S,
        headers: Mapping[str, str] | None = None,
        verify: bool | str = True,
        client_cert: TlsFiles | None = None,
    ) -> None:
        self.kube = kube
        self.scheduler_name = scheduler_name
        self.retry_after = retry_after  # the first backoff; each failed attempt of the same pod doubles it
        self.max_backoff = max(max_backoff, retry_after)
        self.attempts: dict[str, int] = {}  # pod uid -> scheduling attempts that failed in a row
        self._backoff_until: dict[str, float] = {}  # pod uid -> loop time before which it is not retried
        self.verdicts: dict[str, Verdict] = {}  # pod uid -> latest verdict
        tls = None
        if verify is not True or client_cert is not None:
            if isinstance(verify, str):
                tls = ssl.create_default_context(cafile=verify)
            else:
                tls = ssl.create_default_context() if verify else _unverified()
            if client_cert is not None:
                # the extender requires mutual TLS (kube-scheduler's tlsConfig certFile/keyFile)
                tls.load_cert_chain(str(client_cert.cert), str(client_cert.key))
        self._http = HttpClient(extender_url, ssl_context=tls, headers=headers, timeout=_HTTP_TIMEOUT_S)
        self._pods = WatchCache(pod_source(kube), name="pods")
        self._nodes = WatchCache(node_source(kube), name="nodes")
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._queued: set[tuple[str, str]] = set()
        self._events = EventRecorder(kube, component=scheduler_name)
        self._binds: set[asyncio.Task[None]] = set()
        # Pods with a node chosen and a bind in flight, as kube-scheduler's cache "assumes" them: the watch
        # events their own cycle causes (the extender's annotation patch) must not schedule them again.
        self.assumed: set[str] = set()

    def _is_ours_and_pending(self, pod: Pod) -> bool:
        return (
            pod.spec.scheduler_name == self.scheduler_name
            and not pod.spec.node_name
            and pod.metadata.deletion_timestamp is None
            and pod.status.phase in ("", "Pending")
            and pod.metadata.uid not in self.assumed
        )

    def _enqueue(self, pod: Pod, *, backoff_done: bool = False) -> None:
        key = (pod.metadata.namespace, pod.metadata.name)
        until = self._backoff_until.get(pod.metadata.uid)
        if until is not None and not backoff_done and asyncio.get_running_loop().time() < until:
            return  # backing off: the timer set when the attempt failed brings it back
        if self._is_ours_and_pending(pod) and key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def _on_pod(self, change: Change[Pod]) -> None:
        if change.type == "DELETED" or change.obj.spec.node_name:
            uid = change.obj.metadata.uid
            self.assumed.discard(uid)  # bound or gone: nothing more to remember
            self.attempts.pop(uid, None)
            self._backoff_until.pop(uid, None)
        if change.type != "DELETED":
            self._enqueue(change.obj)

    async def run(self) -> None:
        self._pods.add_handler(self._on_pod)
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._pods.run())
                tasks.create_task(self._nodes.run())
                await self._pods.synced.wait()
                await self._nodes.synced.wait()
                tasks.create_task(self._cycle_forever())
        finally:
            for task in list(self._binds):
                task.cancel()
            await self._http.aclose()

    async def _cycle_forever(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            pod = self._pods.get(*key)
            if pod is None or not self._is_ours_and_pending(pod):
                continue
            verdict = await self.schedule_one(pod)
            if not verdict.node:
                self._back_off(pod)

    def backoff_of(self, attempts: int) -> float:
        """kube-scheduler's backoff after ``attempts`` failures in a row: initial x 2^(attempts-1), capped."""
        doublings = min(max(attempts - 1, 0), 32)  # bounded: a float power of two cannot overflow
        return min(self.retry_after * float(2**doublings), self.max_backoff)

    def _back_off(self, pod: Pod) -> None:
        uid = pod.metadata.uid
        attempts = self.attempts[uid] = self.attempts.get(uid, 0) + 1
        delay = self.backoff_of(attempts)
        loop = asyncio.get_running_loop()
        self._backoff_until[uid] = loop.time() + delay
        loop.call_later(delay, self._requeue, (pod.metadata.namespace, pod.metadata.name))

    def _requeue(self, key: tuple[str, str]) -> None:
        pod = self._pods.get(*key)
        if pod is not None:
            self._backoff_until.pop(pod.metadata.uid, None)
            self._enqueue(pod, backoff_done=True)

    async def schedule_one(self, pod: Pod) -> Verdict:
        """One scheduling cycle: filter, then bind in the background; returns the filter's verdict."""
        names = sorted(node.metadata.name for node in self._nodes.items() if _schedulable(node))
        if not names:  # kube-scheduler calls no extender when no node is left to offer
            await self._events.record(reference_to(pod, "Pod"), "Warning", FAILED_SCHEDULING, NO_NODES)
            return self._record(pod, Verdict(error=NO_NODES))
        args = ExtenderArgs(Pod=msgspec.Raw(msgspec.json.encode(pod)), NodeNames=names)
        try:
            answer = await self._post(FILTER_PATH, args, FilterResult)
        except (HttpError, msgspec.DecodeError) as err:
            answer = FilterResult(Error=f"filter: {err}")
        if answer.Error:
            # kube-scheduler turns an extender error into a FailedScheduling Event on the pod (k8s-interfaces
            # §2.3): the user sees why with kubectl describe, once, counted, instead of only in our logs.
            await self._events.record(reference_to(pod, "Pod"), "Warning", FAILED_SCHEDULING, answer.Error)
            return self._record(pod, Verdict(error=answer.Error))
        if not answer.NodeNames:
            reasons = {**(answer.FailedNodes or {}), **(answer.FailedAndUnresolvableNodes or {})}
            verdict = self._record(pod, Verdict(reasons=reasons))
            await self._events.record(
                reference_to(pod, "Pod"), "Warning", FAILED_SCHEDULING,
                unschedulable_message(reasons, len(names)),
            )  # fmt: skip
            return verdict
        node = answer.NodeNames[0]
        self.assumed.add(pod.metadata.uid)
        task = asyncio.create_task(self._bind(pod, node))
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)
        return Verdict(node=node)

    async def _bind(self, pod: Pod, node: str) -> None:
        meta = pod.metadata
        args = BindingArgs(PodName=meta.name, PodNamespace=meta.namespace, PodUID=meta.uid, Node=node)
        try:
            answer = await self._post(BIND_PATH, args, BindingResult)
            error = answer.Error
        except (HttpError, msgspec.DecodeError) as err:
            error = f"bind: {err}"
        if error:
            log.info("binding %s/%s to %s failed, will retry: %s", meta.namespace, meta.name, node, error)
            self.assumed.discard(meta.uid)
            self._record(pod, Verdict(error=error))
            self._back_off(pod)
            return
        self.attempts.pop(meta.uid, None)
        self._record(pod, Verdict(node=node))

    async def _post(self, path: str, body: msgspec.Struct, answer: type[R]) -> R:
        reply = await self._http.post(path, msgspec.json.encode(body))
        if reply.status != HTTPStatus.OK:
            raise HttpError(f"POST {path}: HTTP {reply.status}: {reply.text[:200]}")
        return msgspec.json.decode(reply.body, type=answer)

    def _record(self, pod: Pod, verdict: Verdict) -> Verdict:
        self.verdicts[pod.metadata.uid] = verdict
        return verdict


def _schedulable(node: Node) -> bool:
    return not any(c.type == "Ready" and c.status == "False" for c in node.status.conditions)


def _unverified() -> ssl.SSLContext:
    """``verify=False``: TLS without checking the extender's certificate (a test set-up only)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
