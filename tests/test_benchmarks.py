"""Every benchmark runs: each script of benchmarks/ with ``--quick`` (the smoke run ``make bench
BENCH_ARGS=--quick`` makes), as a user runs it, exits 0 and ends with its one-line JSON summary. A benchmark
that broke (as the Allocate benchmark did when grants became signed) fails here, not on the day someone
needs its figures. No figure is asserted: the machines are shared and noisy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

ROOT: Final = Path(__file__).resolve().parent.parent
BENCHMARKS: Final = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
# side_by_side.py compares two revisions: here this tree with its own HEAD, checked out in a git worktree
EXTRA_ARGS: Final = {"side_by_side.py": ["--against", "HEAD", "--quick", "webhook.py"]}


def run_benchmark(script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{(done.stderr or done.stdout)[-3000:]}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"{script} printed nothing"
    summary = json.loads(lines[-1])
    assert isinstance(summary, dict), lines[-1]
    assert summary, f"{script}: an empty summary"
    return summary


def test_every_benchmark_is_listed() -> None:
    assert {"allocate.py", "e2e.py", "extender_filter.py", "webhook.py"} <= set(BENCHMARKS)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("script", BENCHMARKS)
def test_the_benchmark_runs_and_ends_with_its_json_summary(script: str) -> None:
    if script == "side_by_side.py" and (shutil.which("git") is None or not (ROOT / ".git").exists()):
        pytest.skip("side_by_side.py needs a git checkout (it checks an earlier revision out in a worktree)")
    summary = run_benchmark(script, *EXTRA_ARGS.get(script, ["--quick"]))
    if script == "e2e.py":  # every pod timed to bound and to allocated, audited
        assert summary["audit_problems"] == 0
        assert summary["allocate_errors"] == 0
        assert 0 < summary["bound_p50_ms"] <= summary["allocated_p99_ms"]
        assert summary["cpu_ms_per_pod_control_plane"] > 0
    if script == "side_by_side.py":
        assert set(summary["this"]) == set(summary["before"])
        assert summary["ratio"]
