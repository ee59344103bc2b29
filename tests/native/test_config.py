"""Where limits come from: HAMi's environment, the read-only limits file (which wins), and what happens
with garbage values (reported once, then treated as if the key were absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.native import _cache_file as spec
from tests.native._probe import OOM, GiB, Probe


def _limits_file(cache: Path, text: str) -> dict[str, str]:
    path = cache.with_name("limits")
    path.write_text(text)
    return {"VGPU_LIMITS_FILE": str(path)}


def test_limits_file_wins_over_the_environment(probe: Probe, cache: Path) -> None:
    env = {**_limits_file(cache, "CUDA_DEVICE_MEMORY_LIMIT=1g\n"), "CUDA_DEVICE_MEMORY_LIMIT": "8g"}
    run = probe.run("init", "alloc:2g", env=env)
    assert run.one("alloc").rc == OOM


def test_limits_file_applies_to_a_scrubbed_environment(probe: Probe, cache: Path) -> None:
    env = _limits_file(
        cache, "# written by the allocator\n\nCUDA_DEVICE_MEMORY_LIMIT_0 = 1024m\nCUDA_TASK_PRIORITY=0\n"
    )
    run = probe.run("init", "totalmem", "alloc:2g", env=env)
    assert run.one("totalmem").num("bytes") == GiB
    assert run.one("alloc").rc == OOM
    assert spec.read_cache(cache).priority == 0


def test_environment_cannot_loosen_a_memory_limit_from_the_file(probe: Probe, cache: Path) -> None:
    env = {**_limits_file(cache, "CUDA_DEVICE_MEMORY_LIMIT=1g\n"), "CUDA_DEVICE_MEMORY_LIMIT_0": "8g"}
    assert probe.run("init", "alloc:2g", env=env).one("alloc").rc == OOM


@pytest.mark.parametrize("value", ["-1g", "abc", "99999999999999999999g", "18014398509481984g", "1.5g", "0x10", "1t"])
def test_garbage_memory_limit_is_reported_once_and_ignored(probe: Probe, value: str) -> None:
    run = probe.run("init", "alloc:10g", "meminfo", env={"CUDA_DEVICE_MEMORY_LIMIT": value})
    assert len(run.log_lines("CUDA_DEVICE_MEMORY_LIMIT")) == 1
    assert run.one("alloc").rc == 0
    assert run.one("meminfo").num("total") == 16 * GiB


def test_garbage_per_device_limit_falls_back_to_the_global_one(probe: Probe) -> None:
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "CUDA_DEVICE_MEMORY_LIMIT_0": "lots"}
    run = probe.run("init", "alloc:2g", env=env)
    assert run.one("alloc").rc == OOM
    assert len(run.log_lines("CUDA_DEVICE_MEMORY_LIMIT_0")) == 1


def test_garbage_in_the_limits_file_is_reported_and_skipped(probe: Probe, cache: Path) -> None:
    env = _limits_file(cache, "this is not a setting\nCUDA_DEVICE_MEMORY_LIMIT=1g\nCUDA_DEVICE_SM_LIMIT=half\n")
    run = probe.run("init", "alloc:2g", env=env)
    assert run.one("alloc").rc == OOM
    assert len(run.log_lines("not a KEY=VALUE line")) == 1
    assert len(run.log_lines("CUDA_DEVICE_SM_LIMIT")) == 1
    assert spec.read_cache(cache).sm_limits[0] == 100


@pytest.mark.parametrize(
    ("key", "value", "field", "expected"),
    [
        ("CUDA_DEVICE_SM_LIMIT", "-5", "sm", 100),
        ("CUDA_DEVICE_SM_LIMIT", "250", "sm", 100),
        ("CUDA_DEVICE_SM_LIMIT", "0", "sm", 100),
        ("CUDA_DEVICE_SM_LIMIT", "30", "sm", 30),
        ("CUDA_TASK_PRIORITY", "urgent", "priority", 1),
        ("CUDA_TASK_PRIORITY", "99999999999999999999", "priority", 1),
    ],
)
def test_sm_limit_and_priority_values_land_in_the_file(
    probe: Probe, cache: Path, key: str, value: str, field: str, expected: int
) -> None:
    probe.run("init", env={key: value})
    f = spec.read_cache(cache)
    assert (f.sm_limits[0] if field == "sm" else f.priority) == expected


@pytest.mark.parametrize("value", ["sometimes", "-3"])
def test_unknown_policy_and_log_level_are_reported_not_fatal(probe: Probe, value: str) -> None:
    run = probe.run("init", "launch:10:1", env={"GPU_CORE_UTILIZATION_POLICY": value, "LIBCUDA_LOG_LEVEL": value})
    assert run.one("launch").rc == 0
    assert len(run.log_lines("ignoring GPU_CORE_UTILIZATION_POLICY")) == 1
    assert len(run.log_lines("ignoring LIBCUDA_LOG_LEVEL")) == 1


@pytest.mark.parametrize(
    ("file_text", "expected"),
    [
        pytest.param("CUDA_TASK_PRIORITY=1\n", 1, id="the file's priority beats the environment's"),
        pytest.param("CUDA_DEVICE_MEMORY_LIMIT=1g\n", 1, id="a file without a priority means the default, never env"),
    ],
)
def test_environment_cannot_raise_the_priority_the_limits_file_sets(
    probe: Probe, cache: Path, file_text: str, expected: int
) -> None:
    env = {**_limits_file(cache, file_text), "CUDA_TASK_PRIORITY": "0"}
    probe.run("init", env=env)
    assert spec.read_cache(cache).priority == expected


def test_unreadable_limits_file_grants_no_gpu_memory(probe: Probe, cache: Path) -> None:
    broken = cache.with_name("limits")
    broken.mkdir()  # exists, but reading it fails (EISDIR): a mode-0400 file is readable by root, this is not
    env = {"VGPU_LIMITS_FILE": str(broken), "CUDA_DEVICE_MEMORY_LIMIT": "8g"}
    run = probe.run("init", "alloc:64m", "meminfo", env=env)
    assert run.one("alloc").rc == OOM
    assert run.one("meminfo").num("total") < 64 * 1024 * 1024
    assert len(run.log_lines("cannot be read")) == 1


def test_garbage_memory_limit_in_the_limits_file_grants_no_gpu_memory(probe: Probe, cache: Path) -> None:
    env = {**_limits_file(cache, "CUDA_DEVICE_MEMORY_LIMIT=lots\n"), "CUDA_DEVICE_MEMORY_LIMIT": "8g"}
    run = probe.run("init", "alloc:64m", env=env)
    assert run.one("alloc").rc == OOM
    assert len(run.log_lines("CUDA_DEVICE_MEMORY_LIMIT")) >= 1
