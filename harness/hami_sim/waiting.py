"""Polling for tests where no event can be awaited (an external process, another thread's state).

Prefer awaiting the event itself; use these only where the condition can only be observed by looking.
Both helpers return the predicate's first truthy value, so a test can write
``pod = await eventually(lambda: cache.get("default", "p"))``.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar, overload

__all__ = ["ConditionTimeoutError", "eventually", "eventually_sync"]

T = TypeVar("T")

DEFAULT_TIMEOUT: Final = 10.0
_FIRST_PAUSE: Final = 0.005
_MAX_PAUSE: Final = 0.1


class ConditionTimeoutError(AssertionError):
    """The predicate never became truthy in time; the message carries its description and last value."""


def _next_pause(pause: float) -> float:
    return min(pause * 2, _MAX_PAUSE)


@overload
async def eventually(
    predicate: Callable[[], Awaitable[T | None]],
    timeout: float = ...,  # noqa: ASYNC109
    what: str = ...,
) -> T: ...


@overload
async def eventually(
    predicate: Callable[[], T | None],
    timeout: float = ...,  # noqa: ASYNC109
    what: str = ...,
) -> T: ...


async def eventually(
    predicate: Callable[[], T | None] | Callable[[], Awaitable[T | None]],
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - a poll budget, not a cancellation scope
    what: str = "condition",
) -> T:
    """Poll ``predicate`` (sync or async) until it returns something truthy; return that value."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pause = _FIRST_PAUSE
    last: object = None
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        last = value
        if loop.time() >= deadline:
            raise ConditionTimeoutError(f"{what} not met within {timeout}s (last value: {last!r})")
        await asyncio.sleep(pause)
        pause = _next_pause(pause)


def eventually_sync(predicate: Callable[[], T | None], timeout: float = DEFAULT_TIMEOUT, what: str = "condition") -> T:
    """The blocking twin of :func:`eventually`, for synchronous tests."""
    deadline = time.monotonic() + timeout
    pause = _FIRST_PAUSE
    waiter = threading.Event()
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise ConditionTimeoutError(f"{what} not met within {timeout}s (last value: {value!r})")
        waiter.wait(pause)
        pause = _next_pause(pause)
