"""CPU time of processes, read from ``/proc`` (Linux): how benchmarks report CPU per pod per service."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

__all__ = ["cpu_seconds", "cpu_used"]

_TICKS: Final = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (0.0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14 and 15 of proc(5))


def cpu_used(before: Mapping[str, float], pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds each named process used since ``before`` (a snapshot of ``cpu_seconds`` by the same names)."""
    return {name: cpu_seconds(pid) - before.get(name, 0.0) for name, pid in pids.items()}
