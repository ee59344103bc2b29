"""The last hours of usage, per card, per pod and for the whole cluster, in bounded memory.

No Prometheus is needed for the page's charts: on each tick the app hands :meth:`History.record` the current
state, and every series gets one sample. A series is a ring of ``capacity`` samples (the oldest dropped),
stored as typed arrays (8 bytes a timestamp, 4 a value) so a thousand pods for two hours cost a few MB;
at most ``max_series`` series are kept (new ones beyond it are refused and counted), and a card or pod not
seen for ``forget_ns`` is forgotten (an ended pod's chart goes with it).

A missing figure (no device sample, no interposer report) is stored as NaN and leaves the chart as
``null``: a gap, never a zero.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Final

import msgspec

from hami_metrics.state import NS_PER_S, ClusterState
from hami_metrics.webview import MIB

__all__ = ["CARD_FIELDS", "CLUSTER_FIELDS", "POD_FIELDS", "Chart", "History", "HistoryLimits"]

CLUSTER_FIELDS: Final = ("memory_mib", "memory_booked_mib", "memory_used_mib", "cores_booked", "utilization_percent")
CARD_FIELDS: Final = ("memory_booked_mib", "memory_used_mib", "cores_booked", "utilization_percent")
POD_FIELDS: Final = ("memory_booked_mib", "memory_used_mib", "sm_util_percent")
CLUSTER: Final = ""
_NAN: Final = float("nan")


class Chart(msgspec.Struct, frozen=True, kw_only=True):
    """One series set as uPlot draws it: ``t`` in epoch seconds, one list of values per field."""

    fields: list[str]
    t: list[float]
    values: list[list[float | None]]
    interval_s: float


@dataclass(frozen=True, slots=True)
class HistoryLimits:
    interval_ns: int = 30 * NS_PER_S  # one sample per tick
    capacity: int = 240  # samples per series: two hours at 30 s
    max_series: int = 20_000  # cards + pods
    forget_ns: int = 600 * NS_PER_S  # a card or pod silent this long loses its history


class _Ring:
    """``capacity`` samples of ``width`` values, the oldest overwritten."""

    __slots__ = ("head", "last_ns", "size", "times", "values")

    def __init__(self, capacity: int, width: int) -> None:
        self.times = array("q", bytes(8 * capacity))
        self.values = [array("f", bytes(4 * capacity)) for _ in range(width)]
        self.head = 0  # where the next sample goes
        self.size = 0
        self.last_ns = 0

    def add(self, now_ns: int, row: tuple[float, ...]) -> None:
        capacity = len(self.times)
        self.times[self.head] = now_ns
        for column, value in zip(self.values, row, strict=True):
            column[self.head] = value
        self.head = (self.head + 1) % capacity
        self.size = min(self.size + 1, capacity)
        self.last_ns = now_ns

    def chart(self, fields: tuple[str, ...], interval_ns: int) -> Chart:
        capacity = len(self.times)
        start = (self.head - self.size) % capacity
        order = [(start + i) % capacity for i in range(self.size)]
        return Chart(
            fields=list(fields),
            t=[self.times[i] / NS_PER_S for i in order],
            values=[[None if math.isnan(v := column[i]) else round(v, 2) for i in order] for column in self.values],
            interval_s=interval_ns / NS_PER_S,
        )


def _figure(value: int | float | None) -> float:
    return _NAN if value is None else float(value)


class History:
    """Mutable, owned by the app; :meth:`record` is called once per tick on the event loop."""

    def __init__(self, limits: HistoryLimits | None = None) -> None:
        self.limits = limits or HistoryLimits()
        self._cards: dict[str, _Ring] = {}
        self._pods: dict[str, _Ring] = {}
        self._cluster = _Ring(self.limits.capacity, len(CLUSTER_FIELDS))
        self.refused = 0  # series not kept because max_series was reached
        self.last_ns = 0

    @property
    def series(self) -> int:
        return len(self._cards) + len(self._pods)

    def _ring(self, rings: dict[str, _Ring], key: str, width: int) -> _Ring | None:
        ring = rings.get(key)
        if ring is None:
            if self.series >= self.limits.max_series:
                self.refused += 1
                return None
            ring = rings[key] = _Ring(self.limits.capacity, width)
        return ring

    def record(self, state: ClusterState, now_ns: int) -> None:
        """One sample of every card, every placed pod and the cluster at ``now_ns``."""
        total_mem = booked_mem = cores = 0
        used: list[int] = []
        utils: list[int] = []
        for node in state.nodes.values():
            booked: dict[str, tuple[int, int]] = {}
            for pod in node.pods.values():
                for d in pod.devices:
                    mem, c = booked.get(d.uuid, (0, 0))
                    booked[d.uuid] = (mem + d.usedmem_mib, c + d.usedcores)
            for dev in node.devices:
                mem, c = booked.get(dev.uuid, (0, 0))
                host = node.host.get(dev.uuid)
                used_mib = None if host is None else host.memory_used_bytes // MIB
                util = None if host is None else host.utilization_percent
                total_mem += dev.devmem_mib
                booked_mem += mem
                cores += c
                if used_mib is not None and util is not None:
                    used.append(used_mib)
                    utils.append(util)
                ring = self._ring(self._cards, dev.uuid, len(CARD_FIELDS))
                if ring is not None:
                    ring.add(now_ns, (float(mem), _figure(used_mib), float(c), _figure(util)))
            reports: dict[str, list[tuple[int, int]]] = {}
            for key, u in node.usage.items():
                reports.setdefault(key[0], []).append((u.used_bytes, u.sm_util_percent))
            for uid, pod in node.pods.items():
                ring = self._ring(self._pods, uid, len(POD_FIELDS))
                if ring is None:
                    continue
                seen = reports.get(uid)
                ring.add(
                    now_ns,
                    (
                        float(sum(d.usedmem_mib for d in pod.devices)),
                        _NAN if not seen else sum(b for b, _ in seen) / MIB,
                        _NAN if not seen else float(max(s for _, s in seen)),
                    ),
                )
        self._cluster.add(
            now_ns,
            (
                float(total_mem),
                float(booked_mem),
                float(sum(used)) if used else _NAN,
                float(cores),
                sum(utils) / len(utils) if utils else _NAN,
            ),
        )
        self._forget(now_ns - self.limits.forget_ns)
        self.last_ns = now_ns

    def _forget(self, cutoff_ns: int) -> None:
        for rings in (self._cards, self._pods):
            for key in [k for k, r in rings.items() if r.last_ns < cutoff_ns]:
                del rings[key]

    def cluster(self) -> Chart:
        return self._cluster.chart(CLUSTER_FIELDS, self.limits.interval_ns)

    def card(self, uuid: str) -> Chart | None:
        ring = self._cards.get(uuid)
        return None if ring is None else ring.chart(CARD_FIELDS, self.limits.interval_ns)

    def pod(self, uid: str) -> Chart | None:
        ring = self._pods.get(uid)
        return None if ring is None else ring.chart(POD_FIELDS, self.limits.interval_ns)
