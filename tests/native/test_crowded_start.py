"""A crowded start: many processes of one container reaching their first CUDA call at the same moment on
a fresh shared-cache file (a job launcher starting one process per rank). Each must get its own slot and
the container's limit, and none may wait on another for long (the hang check is the timeouts)."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from tests.native import _cache_file as spec
from tests.native._probe import MiB, Probe, Record, Session

PROCESSES = 64
LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "1000m"}
HELD = 4 * MiB


def _record(session: Session, command: str) -> Record:
    record = session.until(command, timeout=60)
    assert isinstance(record, Record), record
    return record


def _start_together(probe: Probe, cache: Path) -> None:
    cache.unlink(missing_ok=True)
    with ExitStack() as stack:
        sessions = [
            stack.enter_context(probe.start("wait", "init", "meminfo", f"alloc:{HELD}", "wait", env=LIMIT))
            for _ in range(PROCESSES)
        ]
        for session in sessions:
            session.wait_ready()  # parked before cuInit: nothing has touched the file yet
        for session in sessions:
            session.proceed()
        views = [_record(s, "meminfo") for s in sessions]
        allocs = [_record(s, "alloc") for s in sessions]
        for session in sessions:
            session.wait_ready()  # every one attached and holding its memory
        during = spec.read_cache(cache)
        for session in sessions:
            session.proceed()
            session.finish()
        pids = sorted(s.pid for s in sessions)
    after = spec.read_cache(cache)

    assert [v.num("total") for v in views] == [1000 * MiB] * PROCESSES
    assert [a.rc for a in allocs] == [0] * PROCESSES
    assert sorted(s.pid for s in during.live_slots()) == pids  # one slot each, none shared or lost
    assert during.proc_num == PROCESSES  # every slot is inside the range the usage sums read
    assert during.usage() == PROCESSES * HELD
    assert during.limits[0] == 1000 * MiB
    assert (during.device_num, during.uuid0[:4]) == (1, "GPU-")  # recorded once for the monitor
    assert after.live_slots() == ()
    assert after.usage() == 0


def test_processes_starting_together_each_get_a_slot_and_the_limit(probe: Probe, cache: Path) -> None:
    for _ in range(3 if probe.variant == "plain" else 1):
        _start_together(probe, cache)
