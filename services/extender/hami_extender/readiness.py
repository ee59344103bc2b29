"""Whether the caches have listed once: Filter must not decide on an empty ledger."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from hami_common.errors import TransientError

__all__ = ["Readiness"]


@dataclass(eq=False)
class Readiness:
    events: Sequence[asyncio.Event]
    wait: float = 5.0

    @property
    def synced(self) -> bool:
        return all(e.is_set() for e in self.events)

    async def ensure(self) -> None:
        if self.synced:
            return
        try:
            async with asyncio.timeout(self.wait):
                for event in self.events:
                    await event.wait()
        except TimeoutError as err:
            raise TransientError("context cancelled: the scheduler caches have not synced yet") from err
