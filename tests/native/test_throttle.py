"""The SM limit: a launch limiter steered by NVML per-process utilisation (scripted by the stub), the
policies, and the monitor's feedback fields in the shared-cache file."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami_sim.waiting import eventually_sync
from tests.native import _cache_file as spec
from tests.native._probe import Probe, Record, Run

CAPACITY = 200_000  # blocks per second the stub GPU runs at 100 %
WINDOW_MS = 200
SM_COUNT = 80
FLOOR_PER_WINDOW = SM_COUNT * WINDOW_MS // 50  # the limiter's floor: one block per SM per 50 ms tick


def _blocks(run: Run) -> list[int]:
    return [r.num("blocks") for r in run.of("window")]


def _throttled(limit: int, policy: str = "force", util: str = "model") -> dict[str, str]:
    return {
        "CUDA_DEVICE_SM_LIMIT": str(limit),
        "GPU_CORE_UTILIZATION_POLICY": policy,
        "VGPU_STUB_CAPACITY": str(CAPACITY),
        "VGPU_STUB_UTIL": util,
        "VGPU_STUB_SM_COUNT": str(SM_COUNT),
    }


@pytest.mark.parametrize("limit", [30, 70])
def test_launch_rate_settles_near_the_sm_limit(plain_probe: Probe, limit: int) -> None:
    run = plain_probe.run("init", f"windows:10:{WINDOW_MS}:100", env=_throttled(limit))
    settled = _blocks(run)[4:]
    achieved = 100 * sum(settled) / (CAPACITY * WINDOW_MS / 1000 * len(settled))
    assert 0.6 * limit <= achieved <= 1.35 * limit, _blocks(run)


@pytest.mark.parametrize("kind", ["plain", "ex", "coop", "multi", "graph"])
def test_busy_gpu_trace_nearly_stops_every_kind_of_launch(probe: Probe, kind: str) -> None:
    run = probe.run("init", f"windows:5:{WINDOW_MS}:20:{kind}", env=_throttled(10, util="100"))
    blocks = _blocks(run)
    assert blocks[-1] < blocks[0], blocks
    assert blocks[-1] <= 2 * FLOOR_PER_WINDOW, blocks


@pytest.mark.parametrize("kind", ["plain", "ex", "coop", "graph"])
def test_per_thread_stream_launches_are_throttled_too(plain_probe: Probe, kind: str) -> None:
    """The _ptsz entry points, as cuGetProcAddress hands them to a program built for per-thread streams."""
    run = plain_probe.run(
        "init", f"windows:5:{WINDOW_MS}:20:{kind}", env=_throttled(10, util="100"), via="procaddr", options=["--ptsz"]
    )
    blocks = _blocks(run)
    assert blocks[-1] < blocks[0], blocks
    assert blocks[-1] <= 2 * FLOOR_PER_WINDOW, blocks


def test_idle_gpu_trace_lets_the_allowance_grow(plain_probe: Probe) -> None:
    run = plain_probe.run("init", f"windows:5:{WINDOW_MS}:100", env=_throttled(10, util="0"))
    blocks = _blocks(run)
    assert blocks[-1] > 4 * blocks[0], blocks


def test_disable_policy_never_throttles(plain_probe: Probe) -> None:
    throttled = plain_probe.run("init", f"windows:3:{WINDOW_MS}:100", env=_throttled(10, util="100"))
    free = plain_probe.run("init", f"windows:3:{WINDOW_MS}:100", env=_throttled(10, "disable", util="100"))
    assert min(_blocks(free)) > 100 * max(_blocks(throttled)), (_blocks(free), _blocks(throttled))


@pytest.mark.parametrize(
    "file_text",
    [
        pytest.param("CUDA_DEVICE_SM_LIMIT=10\n", id="the file sets the limit and says nothing of the policy"),
        pytest.param("CUDA_DEVICE_SM_LIMIT=10\nGPU_CORE_UTILIZATION_POLICY=default\n", id="the file pins default"),
    ],
)
def test_environment_cannot_switch_off_the_sm_limit_of_the_limits_file(
    plain_probe: Probe, cache: Path, file_text: str
) -> None:
    limits = cache.with_name("limits")
    limits.write_text(file_text)
    tenant = {**_throttled(100, "disable", util="100"), "VGPU_LIMITS_FILE": str(limits)}
    pinned = plain_probe.run("init", f"windows:3:{WINDOW_MS}:100", env=tenant)
    free = plain_probe.run("init", f"windows:3:{WINDOW_MS}:100", env=_throttled(10, "disable", util="100"))
    assert 100 * max(_blocks(pinned)) < min(_blocks(free)), (_blocks(pinned), _blocks(free))
    assert _blocks(pinned)[-1] <= 2 * FLOOR_PER_WINDOW, _blocks(pinned)


def test_no_sm_limit_means_no_throttling(plain_probe: Probe) -> None:
    run = plain_probe.run("init", f"windows:2:{WINDOW_MS}:100", env=_throttled(100, util="100"))
    assert min(_blocks(run)) > 100 * CAPACITY * WINDOW_MS / 1000 / 100


def test_default_policy_follows_the_monitors_utilization_switch(plain_probe: Probe, cache: Path) -> None:
    env = _throttled(10, policy="default", util="100")
    with plain_probe.start("init", "wait", f"windows:4:{WINDOW_MS}:100", env=env) as session:
        session.wait_ready()
        spec.write_i32(cache, spec.UTILIZATION_SWITCH, 0)  # the monitor: this container is alone
        session.proceed()
        records, _ = session.finish()
    blocks = [r.num("blocks") for r in records if r.command == "window"]
    assert blocks[-1] > 100 * CAPACITY * WINDOW_MS / 1000, blocks


def test_recent_kernel_minus_one_blocks_launches_until_cleared(probe: Probe, cache: Path) -> None:
    with probe.start("init", "wait", "launch:1:1", env=_throttled(50)) as session:
        session.wait_ready()
        spec.write_i32(cache, spec.RECENT_KERNEL, -1)  # the monitor: a higher-priority task is active
        session.proceed()
        assert session.next_line(timeout=0.5) is None
        spec.write_i32(cache, spec.RECENT_KERNEL, 0)
        launched = session.until("launch")
        session.finish()
    assert isinstance(launched, Record)
    assert launched.rc == 0


def test_launches_refresh_the_monitor_fields(probe: Probe, cache: Path) -> None:
    with probe.start("init", "wait", "launch:100:1", "wait", env=_throttled(50)) as session:
        session.wait_ready()
        spec.write_i32(cache, spec.RECENT_KERNEL, 0)  # the monitor decremented it to "idle"
        session.proceed()
        session.wait_ready()
        fields = eventually_sync(
            lambda: (f := spec.read_cache(cache)).recent_kernel == 2 and f.last_kernel_time > 0,
            what="recent_kernel and last_kernel_time set",
        )
        session.proceed()
        session.finish()
    assert fields


def test_process_utilisation_is_published_for_the_monitor(plain_probe: Probe, cache: Path) -> None:
    with plain_probe.start("init", f"windows:10:{WINDOW_MS}:100", env=_throttled(50)) as session:
        slot = eventually_sync(lambda: _busy_slot(cache), what="sm_util and hostpid published")
        session.finish()
    assert slot.hostpid == session.pid


def _busy_slot(cache: Path) -> spec.Slot | None:
    if not cache.exists() or cache.stat().st_size < spec.FILE_SIZE:
        return None  # not created yet
    slots = spec.read_cache(cache).live_slots()
    return next((s for s in slots if s.sm_util[0] > 0 and s.hostpid), None)
