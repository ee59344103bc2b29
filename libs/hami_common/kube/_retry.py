"""Retrying resourceVersion-guarded writes that lost a race (409 Conflict), with jittered backoff."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from hami_common.errors import Conflict

__all__ = ["Backoff", "Retried", "retry_on_conflict"]

# One generator for every retry: a new Random() per call seeds itself from os.urandom, a cost on every write.
_RNG = random.Random()
S = TypeVar("S")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays ``initial * factor**n``, capped at ``cap``, each stretched by up to ``jitter`` of itself."""

    initial: float = 0.05
    factor: float = 2.0
    cap: float = 1.0
    jitter: float = 0.5

    def delay(self, attempt: int, rng: random.Random) -> float:
        base = min(self.cap, self.initial * self.factor**attempt)
        return base * (1 + self.jitter * rng.random())


@dataclass(frozen=True, slots=True)
class Retried(Generic[R]):
    """The result of a guarded write and how many conflicts it took to get there."""

    value: R
    conflicts: int


async def retry_on_conflict(
    read: Callable[[], Awaitable[S]],
    write: Callable[[S], Awaitable[R]],
    *,
    attempts: int = 8,
    backoff: Backoff = Backoff(),
    rng: random.Random | None = None,
) -> Retried[R]:
    """``write(await read())`` until it does not raise :class:`Conflict`, at most ``attempts`` times.

    ``write`` must send the resourceVersion of what ``read`` returned, so a stale write fails instead of
    overwriting. The last Conflict propagates when every attempt lost.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    chooser = rng or _RNG
    for attempt in range(attempts):
        current = await read()
        try:
            return Retried(await write(current), attempt)
        except Conflict:
            if attempt == attempts - 1:
                raise
        await asyncio.sleep(backoff.delay(attempt, chooser))
    raise AssertionError("unreachable")
