"""A restartable in-process service: an async body run until its own stop event, started again on demand."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from hami_sim.realk8s import Peer

__all__ = ["Body", "FailureHook", "ProcessService", "RunningService"]

log = logging.getLogger(__name__)

Body = Callable[[asyncio.Event], Awaitable[None]]
FailureHook = Callable[[str, BaseException], None]


class RunningService:
    """One service body as a task of the stack's TaskGroup. A body that fails is logged and recorded in
    ``failures``, never allowed to take the other services down with it."""

    def __init__(self, name: str, body: Body, tasks: asyncio.TaskGroup, on_failure: FailureHook | None = None) -> None:
        self.name = name
        self._on_failure = on_failure
        self._body = body
        self._tasks = tasks
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failures: list[BaseException] = []
        self.starts = 0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _guarded(self, stop: asyncio.Event) -> None:
        try:
            await self._body(stop)
        except (Exception, SystemExit) as err:  # the edge of one service: log it, keep the others serving
            log.error("%s failed: %r", self.name, err, exc_info=err)
            self.failures.append(err)
            if self._on_failure is not None:
                self._on_failure(self.name, err)

    def start(self) -> None:
        if self.running:
            return
        self._stop = asyncio.Event()
        self._task = self._tasks.create_task(self._guarded(self._stop), name=self.name)
        self.starts += 1

    async def stop(self) -> None:
        task = self._task
        if task is None:
            return
        self._stop.set()
        await asyncio.wait({task})
        self._task = None

    async def restart(self) -> None:
        await self.stop()
        self.start()


class ProcessService:
    """A launched container (hami_sim.deployed) with :class:`RunningService`'s surface: the stack starts,
    stops and restarts it alike; an exit on its own (the launcher restarts it) counts as a failure."""

    def __init__(self, name: str, peer: Peer) -> None:
        self.name = name
        self.peer = peer

    @property
    def running(self) -> bool:
        return self.peer.running

    @property
    def failures(self) -> list[BaseException]:
        return [RuntimeError(f"exited with {code}") for code in self.peer.exits]

    def start(self) -> None:
        self.peer.start()

    async def stop(self) -> None:
        await asyncio.to_thread(self.peer.stop)

    async def restart(self) -> None:
        await self.stop()
        self.start()
