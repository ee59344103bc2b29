"""eventually(): returns the predicate's first truthy value, or fails naming what it waited for."""

from __future__ import annotations

import pytest

from hami_sim.waiting import ConditionTimeoutError, eventually, eventually_sync


async def test_eventually_returns_the_first_truthy_value() -> None:
    calls = iter([None, 0, "found"])
    assert await eventually(lambda: next(calls)) == "found"


async def test_eventually_awaits_async_predicates() -> None:
    async def ready() -> int:
        return 3

    assert await eventually(ready) == 3


async def test_eventually_fails_with_the_description_and_last_value() -> None:
    with pytest.raises(ConditionTimeoutError, match=r"the pod not met .*last value: 0"):
        await eventually(lambda: 0, timeout=0.01, what="the pod")


def test_eventually_sync_polls_until_true() -> None:
    calls = iter([False, True])
    assert eventually_sync(lambda: next(calls)) is True
    with pytest.raises(ConditionTimeoutError):
        eventually_sync(lambda: None, timeout=0.01)
