"""Processes of one container competing for the same memory limit at the same time: a request that can
never fit must not make one that fits fail, and processes filling together end at exactly the limit."""

from __future__ import annotations

import os
import subprocess
from contextlib import ExitStack
from pathlib import Path

from tests.native import _cache_file as spec
from tests.native._probe import OOM, MiB, Probe, Record, Session, environment, program

LIMIT = {"CUDA_DEVICE_MEMORY_LIMIT": "1000m"}
CHURN_MS = 3000


def _result(session: Session, command: str) -> Record:
    record = session.until(command, timeout=60)
    assert isinstance(record, Record), record
    return record


def test_a_request_over_the_limit_never_makes_a_fitting_one_fail(probe: Probe) -> None:
    """A holds 900 MiB of 1000; B keeps asking for 200 MiB (never fits); C keeps asking for 50 MiB (always
    fits, since B never gets anything). C must never see an out-of-memory error."""
    with ExitStack() as stack:
        holder = stack.enter_context(probe.start("init", "alloc:900m", "wait", env=LIMIT))
        holder.wait_ready()
        greedy = stack.enter_context(probe.start("init", "wait", f"churn:200m:{CHURN_MS}", env=LIMIT))
        modest = stack.enter_context(probe.start("init", "wait", f"churn:50m:{CHURN_MS}", env=LIMIT))
        greedy.wait_ready()
        modest.wait_ready()
        greedy.proceed()
        modest.proceed()
        too_big, fits = _result(greedy, "churn"), _result(modest, "churn")
        _, modest_log = modest.finish()
        greedy.finish()
        holder.proceed()
        holder.finish()
    assert (too_big.num("ok"), too_big.num("other")) == (0, 0), too_big
    assert too_big.num("oom") > 0, too_big
    assert (fits.num("oom"), fits.num("other")) == (0, 0), fits
    assert fits.num("ok") > 0, fits
    assert "OOM" not in modest_log, modest_log


def test_processes_filling_at_once_end_at_exactly_the_limit(probe: Probe, cache: Path) -> None:
    with ExitStack() as stack:
        fillers = [stack.enter_context(probe.start("init", "wait", "fill:1m", "wait", env=LIMIT)) for _ in range(8)]
        for filler in fillers:
            filler.wait_ready()
        for filler in fillers:
            filler.proceed()
        results = [_result(filler, "fill") for filler in fillers]
        for filler in fillers:
            filler.wait_ready()
        usage = spec.read_cache(cache).usage()
        for filler in fillers:
            filler.proceed()
            filler.finish()
    assert all(r.rc == OOM for r in results), results
    assert sum(r.num("granted") for r in results) == 1000, results
    assert usage == 1000 * MiB


def test_sixty_four_processes_released_at_once_all_initialise(cache: Path) -> None:
    """A crowded start: 64 processes parked on one pipe, released together on a fresh cache file, 20
    times over. Every one must initialise and allocate; none may hang (the timeout is the hang check)."""
    env = environment("plain", cache, LIMIT)
    for _ in range(20):
        cache.unlink(missing_ok=True)
        barrier_r, barrier_w = os.pipe()
        try:
            procs = [
                subprocess.Popen(
                    [str(program("bench_hooks")), "init", "wait"], env=env, stdin=barrier_r, stdout=subprocess.PIPE
                )
                for _ in range(64)
            ]
        finally:
            os.close(barrier_r)
        try:
            for p in procs:
                assert p.stdout is not None
                assert p.stdout.readline().strip() == b"ready"
        finally:
            os.close(barrier_w)
        for p in procs:
            p.communicate(timeout=60)
            assert p.returncode == 0
        f = spec.read_cache(cache)
        assert f.live_slots() == ()
        assert f.usage() == 0
