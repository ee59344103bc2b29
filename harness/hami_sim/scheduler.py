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

Before the extender, the driver filters nodes as kube-scheduler's TaintToleration plugin does (a node with a
``NoSchedule`` or ``NoExecute`` taint the pod does not tolerate is out: ``node(s) had untolerated taint {k: v}``),
then as its NodeResourcesFit plugin does: the pod's
requests (containers summed, init containers at their largest; a request defaults to its limit) against
each node's allocatable less what the pods bound there (or assumed) request, for every resource but those
an extender manages with ``ignoredByScheduler: true``; a node short of one gets ``Insufficient <resource>``.
As kube-scheduler with ``managedResources`` (k8s-interfaces §2.3), the extender is asked only about pods
whose containers or init containers name a managed resource (all pods when none is configured); any other
pod is placed on the first node that fits and bound through the API, as the default binder does.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from http import HTTPStatus
from typing import Final, TypeVar

import msgspec

from hami_common.errors import HamiError, InvalidInput
from hami_common.kube import (
    FAILED_SCHEDULING,
    Change,
    Container,
    EventRecorder,
    KubeClient,
    Node,
    Pod,
    Toleration,
    WatchCache,
    node_source,
    pod_source,
    reference_to,
)
from hami_common.quantity import parse_quantity
from hami_common.scheduling import DEFAULT_SCHEDULER_NAME
from hami_sim.http import HttpClient, HttpError
from hami_sim.realk8s import ManagedResource
from hami_sim.tls import TlsFiles

__all__ = [
    "FAILED_SCHEDULING",
    "ExtenderArgs",
    "FilterResult",
    "SchedulerDriver",
    "Verdict",
    "insufficient",
    "is_unschedulable_message",
    "pod_requests",
    "untolerated_taint",
]

log = logging.getLogger(__name__)
R = TypeVar("R")

FILTER_PATH: Final = "/filter"
BIND_PATH: Final = "/bind"
DEFAULT_SCHEDULER: Final = DEFAULT_SCHEDULER_NAME
NO_NODES: Final = "no nodes available to schedule pods"
_HTTP_TIMEOUT_S: Final = 30.0  # HAMi's chart: httpTimeout 30s
INITIAL_BACKOFF_S: Final = 1.0  # kube-scheduler's podInitialBackoffSeconds
MAX_BACKOFF_S: Final = 10.0  # kube-scheduler's podMaxBackoffSeconds
PODS: Final = "pods"  # the allocatable count of pods a node takes (NodeResourcesFit: "Too many pods")
TOO_MANY_PODS: Final = "Too many pods"
_TERMINAL: Final = frozenset({"Succeeded", "Failed"})  # pods that no longer hold what they requested
_REPELLING: Final = frozenset({"NoSchedule", "NoExecute"})  # taint effects TaintToleration filters on
EXISTS: Final = "Exists"  # toleration operators
EQUAL: Final = "Equal"


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


def _container_requests(container: Container) -> dict[str, Fraction]:
    """What a container requests: its requests, a limit standing in where the request is missing (the
    apiserver defaults requests to limits)."""
    wanted = {**container.resources.limits, **container.resources.requests}
    found: dict[str, Fraction] = {}
    for name, text in wanted.items():
        try:
            found[name] = parse_quantity(text)
        except InvalidInput:
            continue  # the apiserver refuses such a pod; nothing to count
    return found


def pod_requests(pod: Pod) -> dict[str, Fraction]:
    """The pod's effective requests as kube-scheduler computes them: the containers' sum, or the largest
    init container's where that is more (init containers run one at a time, before the others)."""
    total: dict[str, Fraction] = {}
    for container in pod.spec.containers:
        for name, amount in _container_requests(container).items():
            total[name] = total.get(name, Fraction(0)) + amount
    for container in pod.spec.init_containers:
        for name, amount in _container_requests(container).items():
            total[name] = max(total.get(name, Fraction(0)), amount)
    return {name: amount for name, amount in total.items() if amount > 0}


def insufficient(
    wanted: Mapping[str, Fraction], node: Node, used: Mapping[str, Fraction], pods_on_node: int
) -> list[str]:
    """NodeResourcesFit's reasons why ``node`` cannot take a pod requesting ``wanted`` (empty: it fits)."""
    allocatable = node.status.allocatable
    reasons = []
    if PODS in allocatable and pods_on_node + 1 > parse_quantity(allocatable[PODS]):
        reasons.append(TOO_MANY_PODS)
    for name, amount in sorted(wanted.items()):
        free = parse_quantity(allocatable.get(name, "0")) - used.get(name, Fraction(0))
        if amount > free:
            reasons.append(f"Insufficient {name}")
    return reasons


def untolerated_taint(node: Node, pod: Pod) -> str:
    """TaintToleration's reason why ``node`` cannot take ``pod``: its first ``NoSchedule`` or ``NoExecute``
    taint that none of the pod's tolerations matches (empty: none)."""
    for taint in node.spec.taints:
        if taint.effect not in _REPELLING:
            continue
        if not any(_tolerates(t, taint.key, taint.value, taint.effect) for t in pod.spec.tolerations):
            return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    return ""


def _tolerates(toleration: Toleration, key: str, value: str, effect: str) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``: an empty effect or key matches any; Exists ignores the value."""
    if toleration.effect and toleration.effect != effect:
        return False
    if toleration.key and toleration.key != key:
        return False
    if toleration.operator == EXISTS:
        return True
    return toleration.operator in ("", EQUAL) and toleration.value == value


def unschedulable_message(reasons: Mapping[str, str], total: int) -> str:
    """kube-scheduler's wording: ``0/N nodes are available: <reason per node>``."""
    detail = ", ".join(f"{node}: {why}" for node, why in sorted(reasons.items()))
    return f"0/{total} nodes are available: {detail}."


def is_unschedulable_message(message: str) -> bool:
    """Whether a FailedScheduling message is a verdict that no node fits (``0/N nodes are available``), which
    stands until the cluster changes; any other (a bind error, an extender error) is retried after a backoff."""
    head, _, rest = message.partition(" nodes are available")
    return bool(rest) and head.startswith("0/") and head[2:].isdigit()


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
        managed: Sequence[ManagedResource] = (),
    ) -> None:
        """``managed``: the extender's ``managedResources`` (none: it is asked about every pod)."""
        self.kube = kube
        self.managed = frozenset(r.name for r in managed)
        self.unchecked = frozenset(r.name for r in managed if r.ignored_by_scheduler)
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
        self._assumed_on: dict[str, tuple[str, dict[str, Fraction]]] = {}  # uid -> node, requests (counted)

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
            self._assumed_on.pop(uid, None)
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

    def interested(self, pod: Pod) -> bool:
        """Whether the extender is asked about ``pod``: kube-scheduler's ``IsInterested`` (a container or an
        init container names a managed resource in its requests or limits; every pod when none is managed)."""
        if not self.managed:
            return True
        containers: Iterable[Container] = (*pod.spec.containers, *pod.spec.init_containers)
        return any(
            name in self.managed
            for c in containers
            for name in (*c.resources.limits, *c.resources.requests)
        )  # fmt: skip

    def _fit(self, pod: Pod, nodes: Sequence[Node]) -> tuple[list[str], dict[str, str]]:
        """NodeResourcesFit over ``nodes``: the names that fit, and why each other one does not."""
        wanted = {k: v for k, v in pod_requests(pod).items() if k not in self.unchecked}
        used: dict[str, dict[str, Fraction]] = {}
        count: dict[str, int] = {}

        def charge(node: str, requests: Mapping[str, Fraction]) -> None:
            count[node] = count.get(node, 0) + 1
            held = used.setdefault(node, {})
            for name, amount in requests.items():
                held[name] = held.get(name, Fraction(0)) + amount

        for other in self._pods.items():
            node = other.spec.node_name
            if node and other.status.phase not in _TERMINAL and other.metadata.uid not in self._assumed_on:
                charge(node, pod_requests(other))
        for node, requests in self._assumed_on.values():
            charge(node, requests)
        fits: list[str] = []
        misfits: dict[str, str] = {}
        for node_obj in nodes:
            name = node_obj.metadata.name
            taint = untolerated_taint(node_obj, pod)  # kube-scheduler's filters stop at the first that fails
            reasons = [taint] if taint else insufficient(wanted, node_obj, used.get(name, {}), count.get(name, 0))
            if reasons:
                misfits[name] = ", ".join(reasons)
            else:
                fits.append(name)
        return fits, misfits

    async def schedule_one(self, pod: Pod) -> Verdict:
        """One scheduling cycle: filter, then bind in the background; returns the filter's verdict."""
        nodes = sorted((n for n in self._nodes.items() if _schedulable(n)), key=lambda n: n.metadata.name)
        if not nodes:  # kube-scheduler calls no extender when no node is left to offer
            await self._events.record(reference_to(pod, "Pod"), "Warning", FAILED_SCHEDULING, NO_NODES)
            return self._record(pod, Verdict(error=NO_NODES))
        names, misfits = self._fit(pod, nodes)
        if not names:  # its own filters left no node: the extender is not asked
            verdict = self._record(pod, Verdict(reasons=misfits))
            await self._events.record(
                reference_to(pod, "Pod"), "Warning", FAILED_SCHEDULING, unschedulable_message(misfits, len(nodes))
            )
            return verdict
        if not self.interested(pod):
            return self._assume(pod, names[0], by_extender=False)
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
            reasons = {**misfits, **(answer.FailedNodes or {}), **(answer.FailedAndUnresolvableNodes or {})}
            verdict = self._record(pod, Verdict(reasons=reasons))
            await self._events.record(
                reference_to(pod, "Pod"), "Warning", FAILED_SCHEDULING,
                unschedulable_message(reasons, len(nodes)),
            )  # fmt: skip
            return verdict
        return self._assume(pod, answer.NodeNames[0], by_extender=True)

    def _assume(self, pod: Pod, node: str, *, by_extender: bool) -> Verdict:
        """Count the pod on ``node`` from now on (as kube-scheduler's cache assumes it) and bind it in the
        background: through the extender, its binder, or through the API as the default binder does."""
        self.assumed.add(pod.metadata.uid)
        self._assumed_on[pod.metadata.uid] = (node, pod_requests(pod))
        task = asyncio.create_task(self._bind(pod, node, by_extender=by_extender))
        self._binds.add(task)
        task.add_done_callback(self._binds.discard)
        return Verdict(node=node)

    async def _bind(self, pod: Pod, node: str, *, by_extender: bool = True) -> None:
        meta = pod.metadata
        args = BindingArgs(PodName=meta.name, PodNamespace=meta.namespace, PodUID=meta.uid, Node=node)
        error = ""
        try:
            if by_extender:
                error = (await self._post(BIND_PATH, args, BindingResult)).Error
            else:
                await self.kube.bind_pod(meta.namespace, meta.name, node, uid=meta.uid)
        except (HttpError, msgspec.DecodeError, HamiError) as err:
            error = f"bind: {err}"
        if error:
            log.info("binding %s/%s to %s failed, will retry: %s", meta.namespace, meta.name, node, error)
            self.assumed.discard(meta.uid)
            self._assumed_on.pop(meta.uid, None)
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
