"""Memory limits: exact error codes, every allocation path, and the memory information applications see."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.native._cache_file import read_cache
from tests.native._probe import OOM, GiB, MiB, Probe, Via

LIMIT_1G = {"CUDA_DEVICE_MEMORY_LIMIT": "1g"}


@pytest.mark.parametrize("via", ["direct", "dlsym", "procaddr"])
def test_alloc_past_limit_returns_out_of_memory_on_every_path(probe: Probe, via: Via) -> None:
    run = probe.run("init", "alloc:600m", "alloc:600m", env=LIMIT_1G, via=via)
    first, second = run.of("alloc")
    assert first.rc == 0
    assert second.rc == OOM
    assert len(run.log_lines("Device 0 OOM")) == 1


def test_alloc_up_to_the_limit_succeeds_and_one_byte_more_fails(probe: Probe) -> None:
    run = probe.run("init", f"alloc:{GiB - 4096}", "alloc:4096", "alloc:1", env=LIMIT_1G)
    assert [r.rc for r in run.of("alloc")] == [0, 0, OOM]


def test_no_limit_set_means_no_limit(probe: Probe) -> None:
    run = probe.run("init", "alloc:10g", "meminfo")
    assert run.one("alloc").rc == 0
    assert run.one("meminfo").num("total") == 16 * GiB  # the stub's physical size


@pytest.mark.parametrize(
    ("value", "limit"),
    [("1073741824", GiB), ("1048576k", GiB), ("1024m", GiB), ("1g", GiB), ("3000m", 3000 * MiB), ("2G", 2 * GiB)],
)
def test_size_suffixes_are_powers_of_1024(probe: Probe, value: str, limit: int) -> None:
    run = probe.run("init", "totalmem", f"alloc:{limit}", "alloc:1", env={"CUDA_DEVICE_MEMORY_LIMIT": value})
    assert run.one("totalmem").num("bytes") == limit
    assert [r.rc for r in run.of("alloc")] == [0, OOM]


def test_per_device_limit_overrides_the_global_one(probe: Probe) -> None:
    env = {
        "CUDA_DEVICE_MEMORY_LIMIT": "4g",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "1g",
        "VGPU_STUB_DEVICES": "2",
    }
    run = probe.run("init", "alloc:2g", "device:1", "alloc:2g", "alloc:3g", env=env)
    assert [r.rc for r in run.of("alloc")] == [OOM, 0, OOM]


@pytest.mark.parametrize(
    "allocation",
    [
        "alloc:600m",
        "managed:600m",
        "async:600m",
        "pool:600m",
        "pitch:65536x9600",
        "vmm:600m",
        "array:40000x4000",
        "array3d:1000x400x400",
        "mipmap:40000x4000",
    ],
)
def test_every_allocation_path_counts_against_the_limit(probe: Probe, allocation: str) -> None:
    run = probe.run("init", allocation, "alloc:600m", "free", "alloc:600m", env=LIMIT_1G)
    made, refused, freed, retried = run.records[2:6]
    assert made.rc == 0, made
    assert refused.rc == OOM
    assert freed.rc == 0
    assert retried.rc == 0


def test_freeing_returns_memory_to_the_slice(probe: Probe) -> None:
    run = probe.run("init", "alloc:700m", "free", "alloc:700m", "meminfo", env=LIMIT_1G)
    assert [r.rc for r in run.of("alloc")] == [0, 0]
    assert run.one("meminfo").num("free") == GiB - 700 * MiB


def test_memory_info_reports_the_slice(probe: Probe) -> None:
    run = probe.run("init", "alloc:512m", "meminfo", "totalmem", "nvmlmem", "nvmlmem2", env=LIMIT_1G)
    meminfo = run.one("meminfo")
    assert (meminfo.num("total"), meminfo.num("free")) == (GiB, 512 * MiB)
    assert run.one("totalmem").num("bytes") == GiB
    for nvml in run.of("nvmlmem"):
        assert (nvml.num("total"), nvml.num("used"), nvml.num("free")) == (GiB, 512 * MiB, 512 * MiB)


def test_memory_info_never_wraps_when_usage_exceeds_the_limit(probe: Probe, cache: Path) -> None:
    """A process started with a stricter limit than the container's sees usage past its limit."""
    with probe.start("init", "alloc:1500m", "wait", env={"CUDA_DEVICE_MEMORY_LIMIT": "2g"}) as holder:
        holder.wait_ready()
        run = probe.run("init", "meminfo", "nvmlmem", "alloc:1m", env=LIMIT_1G)
        holder.proceed()
        holder.finish()
    meminfo, nvml = run.one("meminfo"), run.one("nvmlmem")
    assert (meminfo.rc, meminfo.num("free"), meminfo.num("total")) == (0, 0, GiB)
    assert (nvml.rc, nvml.num("free"), nvml.num("used")) == (0, 0, 1500 * MiB)
    assert run.one("alloc").rc == OOM
    assert read_cache(cache).usage() == 0


def test_memory_info_with_null_outputs_is_an_error_not_a_crash(probe: Probe) -> None:
    assert probe.run("init", "meminfo-null", env=LIMIT_1G).one("meminfo-null").rc == 1


def test_total_memory_without_a_limit_is_the_device_size(probe: Probe) -> None:
    assert probe.run("init", "totalmem").one("totalmem").num("bytes") == 16 * GiB


def test_driver_errors_pass_through_and_leave_no_charge(probe: Probe, cache: Path) -> None:
    env = {**LIMIT_1G, "VGPU_STUB_FAIL": "cuMemAlloc_v2=999"}
    with probe.start("init", "alloc:100m", "wait", env=env) as session:
        session.wait_ready()
        assert read_cache(cache).usage() == 0
        session.proceed()
        records, _ = session.finish()
    assert [r.rc for r in records if r.command == "alloc"] == [999]


def test_child_after_fork_shares_the_limit(probe: Probe) -> None:
    run = probe.run("init", "alloc:600m", "fork:600m", "fork:300m", env=LIMIT_1G)
    assert [r.num("child_rc") for r in run.of("fork")] == [OOM, 0]
