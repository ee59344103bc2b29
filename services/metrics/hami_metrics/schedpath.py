"""The scheduling path as the bus shows it: cumulative counters and latency histograms, pure updates.

What the events carry today gives admissions, placements, allocations by path (staged or fallback) and
result, admission-to-bind and bind-to-Allocate times, and each event's delivery lag. The optional timings of
:class:`~hami_common.events.PlacementDecision` and :class:`~hami_common.events.AllocationResult` (filter,
bind, hand-off wait, Allocate) are counted when publishers send them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from hami_common.events import AdmissionEvent, AllocationResult, PlacementDecision
from hami_metrics.histogram import Histogram

__all__ = ["PathStats", "on_admission", "on_allocation", "on_placement", "with_lag"]

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

_EMPTY: Final = Histogram()


@dataclass(frozen=True, slots=True)
class PathStats:
    """Cumulative scheduling-path figures (counters and histograms only grow)."""

    admissions: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (namespace, result) -> n
    placements: int = 0
    allocations: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (path, result) -> n
    admission_to_bind: Histogram = _EMPTY
    filter: Histogram = _EMPTY
    bind: Histogram = _EMPTY
    handoff_wait: Histogram = _EMPTY
    bind_to_allocate: Mapping[str, Histogram] = field(default_factory=dict)  # path -> seconds
    allocate: Mapping[str, Histogram] = field(default_factory=dict)  # path -> seconds
    delivery_lag: Mapping[str, Histogram] = field(default_factory=dict)  # bus kind -> seconds
    pending_admissions: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # uid -> (at_ns, seen_ns)


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
    admissions = dict(path.admissions)
    admissions[(ev.namespace, result)] = admissions.get((ev.namespace, result), 0) + 1
    path = replace(with_lag(path, KIND_ADMISSION, ev.at_ns, now_ns), admissions=admissions)
    if ev.allowed and ev.gpu_containers > 0:  # only GPU pods reach our bind
        pending = dict(path.pending_admissions)
        pending[ev.pod_uid] = (ev.at_ns, now_ns)
        path = replace(path, pending_admissions=pending)
    return path


def on_placement(path: PathStats, ev: PlacementDecision, now_ns: int) -> PathStats:
    path = with_lag(path, KIND_PLACEMENT, ev.bind_time_ns, now_ns)
    changes: dict[str, object] = {"placements": path.placements + 1}
    pending = path.pending_admissions.get(ev.pod_uid)
    if pending is not None:
        changes["pending_admissions"] = {uid: v for uid, v in path.pending_admissions.items() if uid != ev.pod_uid}
        changes["admission_to_bind"] = path.admission_to_bind.observe(_seconds(ev.bind_time_ns - pending[0]))
    if isinstance(ev, PlacementDecision):
        for name, ns in (("filter", ev.filter_ns), ("bind", ev.bind_ns), ("handoff_wait", ev.handoff_wait_ns)):
            if ns is not None:
                changes[name] = getattr(path, name).observe(_seconds(ns))
    return replace(path, **changes)  # type: ignore[arg-type]


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
