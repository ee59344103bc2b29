"""The priority feedback HAMi's vGPU monitor writes into each container's cache file (vgpu-interposer §6), pure.

Every period, for the containers of this node:

1. a container whose ``recent_kernel`` is positive has it decremented; if it is still positive the container
   counts as *active* on each of its GPUs, at its priority;
2. a container with a *strictly more important* (smaller number) active neighbour on any of its GPUs is
   blocked (``recent_kernel = -1``); otherwise a negative value is reset to 0. Its ``utilization_switch`` is 1
   when such a neighbour is active, or more than one container of its own priority is active on a GPU, else 0.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["FeedbackInput", "FeedbackWrite", "plan_feedback"]

BLOCKED: Final = -1  # recent_kernel value that makes libvgpu wait before every launch


@dataclass(frozen=True, slots=True)
class FeedbackInput:
    key: str  # which container (its cache file)
    priority: int
    recent_kernel: int
    utilization_switch: int
    device_uuids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FeedbackWrite:
    key: str
    recent_kernel: int | None  # None: leave as is
    utilization_switch: int | None


def plan_feedback(containers: Sequence[FeedbackInput]) -> tuple[FeedbackWrite, ...]:
    """The writes of one period; containers whose fields keep their values get no write."""
    decremented: dict[str, int] = {}
    active: defaultdict[str, Counter[int]] = defaultdict(Counter)
    for ctr in containers:
        recent = ctr.recent_kernel
        if recent > 0:
            recent -= 1
            if recent > 0:
                for uuid in ctr.device_uuids:
                    if uuid:
                        active[uuid][ctr.priority] += 1
        decremented[ctr.key] = recent
    writes: list[FeedbackWrite] = []
    for ctr in containers:
        recent = decremented[ctr.key]
        on_gpus = [active[uuid] for uuid in ctr.device_uuids if uuid]
        outranked = any(count for gpu in on_gpus for prio, count in gpu.items() if prio < ctr.priority)
        crowded = any(gpu[ctr.priority] > 1 for gpu in on_gpus)
        if outranked:
            recent = BLOCKED
        elif recent < 0:
            recent = 0
        switch = 1 if outranked or crowded else 0
        new_recent = recent if recent != ctr.recent_kernel else None
        new_switch = switch if switch != ctr.utilization_switch else None
        if new_recent is not None or new_switch is not None:
            writes.append(FeedbackWrite(ctr.key, new_recent, new_switch))
    return tuple(writes)
