"""Context memory: what the driver holds for each CUDA context is charged against the limit, in the
shared cache's context field, so a container's usage is what nvidia-smi shows on the host.

The stub driver gives every live context VGPU_STUB_CONTEXT_SIZE bytes in NVML's per-process memory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_common.sharedcache import read_shared_cache
from tests.native import _cache_file as spec
from tests.native._probe import OOM, GiB, MiB, Probe, Via

CONTEXT = 300 * MiB
LIMIT_1G = {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "VGPU_STUB_CONTEXT_SIZE": "300m"}


def _held(probe: Probe, cache: Path, *commands: str, env: dict[str, str]) -> spec.Slot:
    """The probe's slot while it runs `commands` and then waits."""
    with probe.start(*commands, "wait", env=env) as session:
        session.wait_ready()
        slot = spec.read_cache(cache).live_slots()
        session.proceed()
        session.finish()
    assert len(slot) == 1
    return slot[0]


def _limits_file(cache: Path, text: str) -> dict[str, str]:
    path = cache.with_suffix(".limits")
    path.write_text(text)
    return {"VGPU_LIMITS_FILE": str(path)}


def test_usage_is_allocations_plus_the_context_the_driver_reports(probe: Probe, cache: Path) -> None:
    slot = _held(probe, cache, "init", "alloc:100m", env=LIMIT_1G)
    assert slot.context_size[0] == CONTEXT
    assert slot.data_size[0] == 100 * MiB
    assert slot.total[0] == CONTEXT + 100 * MiB


@pytest.mark.parametrize("size", ["0", "1m", "123m"])
def test_the_charge_is_the_drivers_figure_not_a_constant(plain_probe: Probe, cache: Path, size: str) -> None:
    env = {**LIMIT_1G, "VGPU_STUB_CONTEXT_SIZE": size}
    slot = _held(plain_probe, cache, "init", "alloc:10m", env=env)
    assert slot.context_size[0] == int(size.rstrip("m")) * MiB


def test_the_applications_view_includes_the_context(probe: Probe) -> None:
    run = probe.run("init", "alloc:100m", "meminfo", "nvmlmem", "nvmlmem2", "procmem", env=LIMIT_1G)
    assert run.one("meminfo").num("free") == GiB - CONTEXT - 100 * MiB
    for nvml in run.of("nvmlmem"):  # nvmlDeviceGetMemoryInfo and _v2
        assert nvml.num("used") == CONTEXT + 100 * MiB
        assert nvml.num("free") == GiB - CONTEXT - 100 * MiB
    # the usage the container is shown is what the driver says the process holds
    assert run.one("procmem").num("bytes") == CONTEXT + 100 * MiB


def test_the_context_leaves_less_of_the_limit_for_allocations(probe: Probe) -> None:
    run = probe.run("init", "alloc:800m", "alloc:700m", env=LIMIT_1G)
    assert [r.rc for r in run.of("alloc")] == [OOM, 0]


@pytest.mark.parametrize("via", ["direct", "dlsym", "procaddr"])
def test_many_contexts_cannot_overrun_the_limit(probe: Probe, via: Via) -> None:
    run = probe.run("init", "ctxmany:0", "procmem", "device:0", "alloc:200m", "alloc:100m", env=LIMIT_1G, via=via)
    many = run.one("ctxmany")
    assert (many.rc, many.num("granted")) == (OOM, 2)  # primary + 2 = 900 MiB; a fourth would be 1200
    assert run.one("procmem").num("bytes") == 3 * CONTEXT  # the refused context was destroyed again
    assert [r.rc for r in run.of("alloc")] == [OOM, 0]
    assert len(run.log_lines("over the limit; context refused")) == 1


@pytest.mark.parametrize("entry", ["ctx", "ctx3", "ctx4"])
def test_every_context_entry_point_is_charged(plain_probe: Probe, cache: Path, entry: str) -> None:
    slot = _held(plain_probe, cache, "init", f"{entry}:0", f"{entry}:0", env=LIMIT_1G)
    assert slot.context_size[0] == 3 * CONTEXT


def test_destroying_a_context_releases_its_charge(probe: Probe, cache: Path) -> None:
    slot = _held(probe, cache, "init", "ctx:0", "ctx:0", "ctxdestroy", env=LIMIT_1G)
    assert slot.context_size[0] == 2 * CONTEXT
    slot = _held(probe, cache, "init", "ctx:0", "ctx:0", "ctxdestroy", "ctxdestroy", env=LIMIT_1G)
    assert slot.context_size[0] == CONTEXT
    run = probe.run("init", "ctxmany:0", "ctxdestroy", "ctxdestroy", "ctxmany:0", env=LIMIT_1G)
    assert [r.num("granted") for r in run.of("ctxmany")] == [2, 2]


def test_the_primary_context_is_charged_once_and_released_with_its_last_retain(probe: Probe, cache: Path) -> None:
    assert _held(probe, cache, "init", "retain:0", env=LIMIT_1G).context_size[0] == CONTEXT
    assert _held(probe, cache, "init", "retain:0", "release:0", env=LIMIT_1G).context_size[0] == CONTEXT
    slot = _held(probe, cache, "init", "retain:0", "release:0", "release:0", env=LIMIT_1G)
    assert slot.context_size[0] == slot.total[0] == 0


def test_a_context_larger_than_the_limit_is_refused(probe: Probe, cache: Path) -> None:
    env = {**LIMIT_1G, "CUDA_DEVICE_MEMORY_LIMIT": "200m"}
    run = probe.run("init", "procmem", env=env)
    assert run.one("device").rc == OOM
    assert run.one("procmem").num("bytes") == 0  # the driver's context was released again
    assert spec.read_cache(cache).usage() == 0


def test_other_processes_contexts_count_against_the_container(probe: Probe) -> None:
    with probe.start("init", "wait", env=LIMIT_1G) as first:
        first.wait_ready()
        second = probe.run("init", "meminfo", "alloc:500m", "alloc:400m", env=LIMIT_1G)
        first.proceed()
        first.finish()
    assert second.one("meminfo").num("free") == GiB - 2 * CONTEXT
    assert [r.rc for r in second.of("alloc")] == [OOM, 0]


def test_ignore_leaves_contexts_uncharged(probe: Probe, cache: Path) -> None:
    env = {**LIMIT_1G, "VGPU_CONTEXT_MEMORY": "ignore"}
    slot = _held(probe, cache, "init", "ctx:0", "alloc:1g", env=env)
    assert (slot.context_size[0], slot.total[0]) == (0, GiB)


def test_the_tenants_environment_cannot_turn_the_charge_off_under_a_limits_file(probe: Probe, cache: Path) -> None:
    env = {
        **_limits_file(cache, "CUDA_DEVICE_MEMORY_LIMIT=1g\n"),
        "VGPU_STUB_CONTEXT_SIZE": "300m",
        "VGPU_CONTEXT_MEMORY": "ignore",
    }
    run = probe.run("init", "alloc:800m", "alloc:700m", env=env)
    assert [r.rc for r in run.of("alloc")] == [OOM, 0]


def test_the_limits_file_may_turn_the_charge_off(plain_probe: Probe, cache: Path) -> None:
    env = {
        **_limits_file(cache, "CUDA_DEVICE_MEMORY_LIMIT=1g\nVGPU_CONTEXT_MEMORY=ignore\n"),
        "VGPU_STUB_CONTEXT_SIZE": "300m",
        "VGPU_CONTEXT_MEMORY": "charge",
    }
    assert plain_probe.run("init", "alloc:1g", env=env).one("alloc").rc == 0


def test_a_garbage_setting_is_reported_and_charges(plain_probe: Probe) -> None:
    run = plain_probe.run("init", "alloc:800m", env={**LIMIT_1G, "VGPU_CONTEXT_MEMORY": "off"})
    assert run.one("alloc").rc == OOM
    assert len(run.log_lines('ignoring VGPU_CONTEXT_MEMORY="off"')) == 1


def test_in_a_pid_namespace_the_new_process_in_nvmls_list_is_ours(probe: Probe, cache: Path) -> None:
    env = {**LIMIT_1G, "VGPU_STUB_PID_OFFSET": "100000", "VGPU_STUB_LIST_AFTER_CONTEXT": "1"}
    with probe.start("init", "ctx:0", "wait", env=env) as session:
        session.wait_ready()
        (slot,) = spec.read_cache(cache).live_slots()
        session.proceed()
        session.finish()
    assert slot.context_size[0] == 2 * CONTEXT
    assert slot.hostpid == session.pid + 100000


def test_when_nvml_cannot_tell_which_process_is_ours_the_growth_on_the_device_is_charged(probe: Probe) -> None:
    # listed from cuInit on under another PID: no PID appears with the context, so no entry is ours; the
    # context is still charged (what appeared on the device meanwhile), never let through for free
    env = {**LIMIT_1G, "VGPU_STUB_PID_OFFSET": "100000"}
    run = probe.run("init", "ctx:0", "alloc:700m", "alloc:100m", env=env)
    assert [a.rc for a in run.of("alloc")] == [OOM, 0]  # 700m + the 300m context would pass 1g; 100m fits
    assert len(run.log_lines("does not tell this process's memory apart")) == 1


def test_the_context_field_reaches_the_python_reader(plain_probe: Probe, cache: Path) -> None:
    with plain_probe.start("init", "ctx:0", "alloc:100m", "wait", env=LIMIT_1G) as session:
        session.wait_ready()
        (device, *_) = read_shared_cache(cache).devices
        session.proceed()
        session.finish()
    assert device.context_bytes == 2 * CONTEXT
    assert device.buffer_bytes == 100 * MiB
    assert device.used_bytes == 2 * CONTEXT + 100 * MiB


@pytest.mark.parametrize("version", ["v1", "v2", "v3"])
def test_the_stub_reports_contexts_in_every_process_list_version(plain_probe: Probe, version: str) -> None:
    env = {"VGPU_STUB_CONTEXT_SIZE": "300m", "VGPU_CONTEXT_MEMORY": "ignore"}
    run = plain_probe.run(
        "init", "ctx:0", "alloc:100m", f"procmem:{version}", "ctxdestroy", f"procmem:{version}", env=env
    )
    assert [r.num("bytes") for r in run.of("procmem")] == [2 * CONTEXT + 100 * MiB, CONTEXT + 100 * MiB]


def test_when_nvml_reports_no_per_process_memory_the_context_is_charged_what_the_device_gained(
    probe: Probe, cache: Path
) -> None:
    """Issue 28 item 10: a driver may list processes with usedGpuMemory NVML_VALUE_NOT_AVAILABLE (2^64-1).
    Taken as a figure it made every context look enormous, so the first allocation was refused; the charge is
    now what the device's used memory gained while the context was created, and the limit still holds."""
    env = {**LIMIT_1G, "VGPU_STUB_PROCESS_MEMORY_NA": "1"}
    run = probe.run("init", "alloc:100m", "alloc:700m", "alloc:100m", env=env)
    assert [a.rc for a in run.of("alloc")] == [0, OOM, 0]  # 100m + 300m context fit; +700m would pass 1g
    assert len(run.log_lines("does not report per-process memory")) == 1
    slot = _held(probe, cache, "init", "alloc:100m", env=env)
    assert slot.context_size[0] == CONTEXT
    assert slot.total[0] == CONTEXT + 100 * MiB
