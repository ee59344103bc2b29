"""The scheduling path as the bus shows it: cumulative counters and latency histograms, pure updates.

What the events carry today gives admissions, placements, allocations by path (staged or fallback) and
result, admission-to-bind and bind-to-Allocate times, and each event's delivery lag. The optional timings of
:class:`~hami_common.events.PlacementDecision` and :class:`~hami_common.events.AllocationResult` (filter,
bind, hand-off wait, Allocate) are counted when publishers send them.

Admissions are counted by namespace, and anyone who reaches the webhook can post a review naming any
namespace (issue 28 item 9). The series stay bounded: at most :data:`MAX_ADMISSION_NAMESPACES` namespaces
have a label of their own (the webhook announces only namespaces its watch knows; this is the backstop), and
a namespace without an admission for a while (deleted, or quiet) gives its label up
(:func:`retire_namespaces`). What has no label of its own counts under :data:`ADMISSION_OTHER_NAMESPACE`,
so the sum over namespaces is still a counter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final, NamedTuple

from hami_common.events import AdmissionEvent, AllocationResult, FilterRefusal, PlacementDecision
from hami_metrics.histogram import Histogram

__all__ = [
    "ADMISSION_OTHER_NAMESPACE",
    "MAX_ADMISSION_NAMESPACES",
    "PathStats",
    "PendingAdmission",
    "on_admission",
    "on_allocation",
    "on_placement",
    "on_refusal",
    "pending_key",
    "retire_namespaces",
    "with_lag",
]

NS_PER_S: Final = 1_000_000_000

# Label values (hami_bus_delivery_lag_seconds{kind}, hami_scheduling_*{path,result}).
KIND_ADMISSION: Final = "admission"
KIND_PLACEMENT: Final = "placement"
KIND_ALLOCATED: Final = "allocated"
KIND_INVENTORY: Final = "inventory"
KIND_USAGE: Final = "usage"
PATH_STAGED: Final = "staged"
PATH_FALLBACK: Final = "fallback"
RESULT_OK: Final = "ok"
RESULT_FAILED: Final = "failed"
ADMISSION_MUTATED: Final = "mutated"
ADMISSION_ALLOWED: Final = "allowed"
ADMISSION_DENIED: Final = "denied"
# No Kubernetes namespace has this name (a DNS-1123 label starts with a letter or digit).
ADMISSION_OTHER_NAMESPACE: Final = "_other"
MAX_ADMISSION_NAMESPACES: Final = 1000  # namespaces with a label of their own; the rest count under _other

_EMPTY: Final = Histogram()


def pending_key(uid: str, namespace: str, name: str) -> str:
    """A pending pod's key: its uid, else ``<namespace>_<name>``. A mutating webhook meets a pod before the
    apiserver gives it a uid, so admissions usually carry none; ``_`` is in no namespace or pod name."""
    return uid or f"{namespace}_{name}"


class PendingAdmission(NamedTuple):
    """A GPU pod the webhook admitted that has no placement yet (the web page lists it as waiting)."""

    at_ns: int  # when the webhook admitted it
    seen_ns: int  # when the aggregator heard of it
    namespace: str = ""
    name: str = ""
    refusal: FilterRefusal | None = None  # the extender's latest "no node fits", with its reasons


@dataclass(frozen=True, slots=True)
class PathStats:
    """Cumulative scheduling-path figures (counters and histograms only grow)."""

    admissions: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (namespace, result) -> n
    admission_seen: Mapping[str, int] = field(default_factory=dict)  # labelled namespace -> last admission ns
    placements: int = 0
    allocations: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (path, result) -> n
    admission_to_bind: Histogram = _EMPTY
    filter: Histogram = _EMPTY
    bind: Histogram = _EMPTY
    handoff_wait: Histogram = _EMPTY
    bind_to_allocate: Mapping[str, Histogram] = field(default_factory=dict)  # path -> seconds
    allocate: Mapping[str, Histogram] = field(default_factory=dict)  # path -> seconds
    delivery_lag: Mapping[str, Histogram] = field(default_factory=dict)  # bus kind -> seconds
    pending_admissions: Mapping[str, PendingAdmission] = field(default_factory=dict)  # by pending_key


def _seconds(ns: int) -> float:
    return max(ns, 0) / NS_PER_S


def _observe(histograms: Mapping[str, Histogram], key: str, ns: int) -> dict[str, Histogram]:
    out = dict(histograms)
    out[key] = out.get(key, _EMPTY).observe(_seconds(ns))
    return out


def with_lag(path: PathStats, kind: str, at_ns: int, now_ns: int) -> PathStats:
    """One more event of ``kind`` published at ``at_ns`` arrived at ``now_ns`` (on every usage sample:
    built without dataclasses.replace, which is several times slower)."""
    p = path
    return PathStats(
        admissions=p.admissions,
        admission_seen=p.admission_seen,
        placements=p.placements,
        allocations=p.allocations,
        admission_to_bind=p.admission_to_bind,
        filter=p.filter,
        bind=p.bind,
        handoff_wait=p.handoff_wait,
        bind_to_allocate=p.bind_to_allocate,
        allocate=p.allocate,
        delivery_lag=_observe(p.delivery_lag, kind, now_ns - at_ns),
        pending_admissions=p.pending_admissions,
    )


def on_admission(path: PathStats, ev: AdmissionEvent, now_ns: int) -> PathStats:
    result = ADMISSION_DENIED if not ev.allowed else ADMISSION_MUTATED if ev.mutated else ADMISSION_ALLOWED
    seen = path.admission_seen
    namespace = ev.namespace
    if namespace in seen or len(seen) < MAX_ADMISSION_NAMESPACES:
        seen = {**seen, namespace: now_ns}
    else:
        namespace = ADMISSION_OTHER_NAMESPACE
    admissions = dict(path.admissions)
    admissions[(namespace, result)] = admissions.get((namespace, result), 0) + 1
    path = replace(with_lag(path, KIND_ADMISSION, ev.at_ns, now_ns), admissions=admissions, admission_seen=seen)
    if ev.allowed and ev.gpu_containers > 0:  # only GPU pods reach our bind
        pending = dict(path.pending_admissions)
        pending[pending_key(ev.pod_uid, ev.namespace, ev.name)] = PendingAdmission(
            ev.at_ns, now_ns, ev.namespace, ev.name
        )
        path = replace(path, pending_admissions=pending)
    return path


def on_placement(path: PathStats, ev: PlacementDecision, now_ns: int) -> PathStats:
    path = with_lag(path, KIND_PLACEMENT, ev.bind_time_ns, now_ns)
    changes: dict[str, object] = {"placements": path.placements + 1}
    keys = {ev.pod_uid, pending_key("", ev.namespace, ev.name)}  # admitted with its uid, or before it had one
    pending = next((p for key in keys if (p := path.pending_admissions.get(key)) is not None), None)
    if pending is not None:
        changes["pending_admissions"] = {k: v for k, v in path.pending_admissions.items() if k not in keys}
        changes["admission_to_bind"] = path.admission_to_bind.observe(_seconds(ev.bind_time_ns - pending.at_ns))
    if isinstance(ev, PlacementDecision):
        for name, ns in (("filter", ev.filter_ns), ("bind", ev.bind_ns), ("handoff_wait", ev.handoff_wait_ns)):
            if ns is not None:
                changes[name] = getattr(path, name).observe(_seconds(ns))
    return replace(path, **changes)  # type: ignore[arg-type]


def on_refusal(path: PathStats, ev: FilterRefusal) -> PathStats:
    """The extender found no node for a pod still waiting: its reasons replace the earlier ones. A refusal of a
    pod the aggregator never saw admitted (it started later) is not kept: nothing would ever remove it."""
    keys = (ev.pod_uid, pending_key("", ev.namespace, ev.name))
    key = next((k for k in keys if k in path.pending_admissions), None)
    if key is None:
        return path
    pending = dict(path.pending_admissions)
    pending[key] = pending[key]._replace(refusal=ev)
    return replace(path, pending_admissions=pending)


def on_allocation(path: PathStats, ev: AllocationResult, bind_time_ns: int | None, now_ns: int) -> PathStats:
    """``bind_time_ns``: when the pod was bound, if its placement is known."""
    path = with_lag(path, KIND_ALLOCATED, ev.at_ns, now_ns)
    route = PATH_STAGED if ev.staged else PATH_FALLBACK
    allocations = dict(path.allocations)
    key = (route, RESULT_OK if ev.ok else RESULT_FAILED)
    allocations[key] = allocations.get(key, 0) + 1
    path = replace(path, allocations=allocations)
    if bind_time_ns is not None:
        path = replace(path, bind_to_allocate=_observe(path.bind_to_allocate, route, ev.at_ns - bind_time_ns))
    if isinstance(ev, AllocationResult) and ev.allocate_ns is not None:
        path = replace(path, allocate=_observe(path.allocate, route, ev.allocate_ns))
    return path


def retire_namespaces(path: PathStats, cutoff_ns: int) -> PathStats:
    """Namespaces without an admission since ``cutoff_ns`` give their label up: their counts move to
    :data:`ADMISSION_OTHER_NAMESPACE` (a deleted namespace's series end; the sum over namespaces never drops).
    Returns ``path`` itself when no namespace is that quiet."""
    quiet = {ns for ns, at in path.admission_seen.items() if at < cutoff_ns}
    if not quiet:
        return path
    admissions: dict[tuple[str, str], int] = {}
    for (namespace, result), n in path.admissions.items():
        key = (ADMISSION_OTHER_NAMESPACE, result) if namespace in quiet else (namespace, result)
        admissions[key] = admissions.get(key, 0) + n
    seen = {ns: at for ns, at in path.admission_seen.items() if ns not in quiet}
    return replace(path, admissions=admissions, admission_seen=seen)
