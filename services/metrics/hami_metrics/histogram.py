"""An immutable Prometheus-style histogram: observing returns a new value, so state stays a pure fold."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Final

__all__ = ["LATENCY_BOUNDS_S", "Histogram"]

# Seconds: from a millisecond hop on the bus to a minute-long wait for a kubelet.
LATENCY_BOUNDS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Per-bucket (not cumulative) counts; ``counts[-1]`` holds what exceeds every bound (``+Inf``)."""

    bounds: tuple[float, ...] = LATENCY_BOUNDS_S
    counts: tuple[int, ...] = (0,) * (len(LATENCY_BOUNDS_S) + 1)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> Histogram:
        slot = bisect.bisect_left(self.bounds, value)  # a value equal to a bound belongs to that bucket (le)
        counts = list(self.counts)
        counts[slot] += 1
        return Histogram(bounds=self.bounds, counts=tuple(counts), total=self.total + value, count=self.count + 1)

    def cumulative(self) -> tuple[int, ...]:
        """Counts per bound as Prometheus exposes them (``le``), then the ``+Inf`` total."""
        out: list[int] = []
        running = 0
        for n in self.counts:
            running += n
            out.append(running)
        return tuple(out)
