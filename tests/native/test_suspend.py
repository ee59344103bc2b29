"""HAMi-core's suspend and resume: SIGUSR2 marks the process's slot suspended (status 2) and holds its
CUDA calls, kernel launches included, until SIGUSR1 resumes it. An application that handles SIGUSR2
itself keeps its handler (HAMi-core replaced it)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from hami_sim.waiting import eventually_sync
from tests.native import _cache_file as spec
from tests.native._probe import Probe, Record, Session

LIMIT_1G = {"CUDA_DEVICE_MEMORY_LIMIT": "1g"}
TICK_S = 0.6  # longer than the sampler's idle tick (500 ms), which recomputes the launch gate


def _status(cache: Path, pid: int) -> int | None:
    return next((s.status for s in spec.read_cache(cache).slots if s.pid == pid), None)


def _with_status(cache: Path, pid: int, status: int) -> int | None:
    return status if _status(cache, pid) == status else None


def _record(session: Session, command: str) -> Record:
    record = session.until(command)
    assert isinstance(record, Record), record
    return record


def test_sigusr2_holds_allocations_and_launches_until_sigusr1(probe: Probe, cache: Path) -> None:
    # The first launch opens the launch gate, so the held one is held by suspension, not by a first tick.
    with probe.start("init", "launch:1:1", "wait", "launch:1:1", "alloc:1m", "wait", env=LIMIT_1G) as session:
        session.wait_ready()
        session.proc.send_signal(signal.SIGUSR2)
        eventually_sync(lambda: _with_status(cache, session.pid, 2), what="slot marked suspended")
        time.sleep(TICK_S)  # a sampler tick in between must not reopen the launch gate
        session.proceed()
        assert session.next_line(timeout=TICK_S) is None  # the launch waits
        session.proc.send_signal(signal.SIGUSR1)
        launch, alloc = _record(session, "launch"), _record(session, "alloc")
        session.wait_ready()
        resumed = _status(cache, session.pid)
        session.proceed()
        session.finish()
    assert (launch.rc, launch.num("n"), alloc.rc) == (0, 1, 0)
    assert resumed == 1


def test_an_application_handling_sigusr2_keeps_its_handler(probe: Probe, cache: Path) -> None:
    with probe.start("catch-usr2", "init", "wait", "alloc:1m", "caught", "wait", env=LIMIT_1G) as session:
        session.wait_ready()
        session.proc.send_signal(signal.SIGUSR2)
        session.proceed()
        alloc, caught = _record(session, "alloc"), _record(session, "caught")
        session.wait_ready()
        status = _status(cache, session.pid)
        session.proceed()
        session.finish()
    assert (alloc.rc, caught.num("n")) == (0, 1)
    assert status == 1  # never suspended
