"""The root Makefile as a new user meets it: ``make run`` builds only what ``hami up`` uses, and the install
shows its progress. Read from ``make -n -B`` (every command it would run, nothing run or rebuilt)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")


def planned(target: str) -> str:
    # not the flags of a `make test` this runs under (its jobserver, its -k): a plan of its own
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_run_builds_the_native_library_only() -> None:
    plan = planned("run")
    assert "-o build/libvgpu.so" in plan
    assert plan.rstrip().endswith("hami up")
    # the sanitizer builds, the stub driver and the test and bench programs are the tests' business
    for unwanted in ("asan", "bench_hooks", "vgpu_probe", "lock_holder", "libcuda.so"):
        assert unwanted not in plan, unwanted


def test_make_test_still_builds_everything_the_tests_use() -> None:
    plan = planned("test")
    for wanted in ("-o build/libvgpu.so", "asan/libvgpu.so", "bench_hooks", "vgpu_probe", "libcuda.so.1"):
        assert wanted in plan, wanted


def test_the_install_shows_pips_progress() -> None:
    install = [line for line in planned("run").splitlines() if "pip install" in line and "-e " in line]
    assert install
    assert all("--quiet" not in line and " -q" not in line for line in install)
