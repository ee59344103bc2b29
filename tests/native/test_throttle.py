"""The SM limit: a launch limiter steered by NVML per-process utilisation, the policies, and the monitor's
feedback fields in the shared-cache file.

The stub reports utilisation either from a scripted trace or from its utilisation model: every kernel
takes modelled device time (a cost per kernel and per block), kernels run back to back on a modelled
timeline, a launch waits while the queue holds more than VGPU_STUB_QUEUE_US of work, and NVML reports the
share of each sampling window the device spent on them. The accuracy tests measure that modelled device
time (`busy_us` of each window), so they stay robust on a busy machine: the device time of a kernel does
not depend on how much CPU the launcher gets, work already launched keeps running while the launcher is
descheduled (the queue holds more than a tick's worth), the limiter steers by the time that really passed
between its ticks, and the assertion is on the average over a whole second after convergence, not on one
window.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from hami_sim.waiting import eventually_sync
from tests.native import _cache_file as spec
from tests.native._probe import Probe, Record, Run

WINDOW_MS = 200
SM_COUNT = 80
BUSY_GRID = 20  # blocks per launch in the scripted-trace tests, where kernels cost no device time


def _blocks(run: Run) -> list[int]:
    return [r.num("blocks") for r in run.of("window")]


def _throttled(limit: int, policy: str = "force", util: str = "model") -> dict[str, str]:
    """A limit over the stub whose kernels cost no device time: launches run as fast as the CPU allows."""
    return {
        "CUDA_DEVICE_SM_LIMIT": str(limit),
        "GPU_CORE_UTILIZATION_POLICY": policy,
        "VGPU_STUB_UTIL": util,
        "VGPU_STUB_SM_COUNT": str(SM_COUNT),
    }


@dataclass(frozen=True, slots=True)
class Kernels:
    """The modelled cost of the probe's kernels and the grid it launches them with."""

    kernel_us: float
    capacity: int  # blocks per second: each block adds 1 / capacity seconds
    grid: int

    def env(self, limit: int) -> dict[str, str]:
        return {
            **_throttled(limit),
            "VGPU_STUB_KERNEL_US": str(self.kernel_us),
            "VGPU_STUB_CAPACITY": str(self.capacity),
        }


WIDE = Kernels(kernel_us=0, capacity=200_000, grid=100)  # 500 us kernels of 100 blocks
# Long kernels of one block: at a 10 % limit two and a half of them fit a 50 ms tick, so the allowance
# must sit between whole blocks, and far below one block per SM.
NARROW = Kernels(kernel_us=2000, capacity=0, grid=1)

MODEL_WINDOW_MS = 100
CONVERGED_AFTER_MS = 1000
MEASURED_MS = 1000


def _utilisation(run: Run, after_ms: int) -> float:
    """Percent of the wall time from `after_ms` on that the modelled GPU spent on the probe's kernels."""
    windows = run.of("window")
    settled = windows[after_ms // MODEL_WINDOW_MS :]
    assert settled, windows
    return 100 * sum(w.num("busy_us") for w in settled) / sum(w.num("wall_us") for w in settled)


def _modelled_windows(probe: Probe, kernels: Kernels, limit: int) -> Run:
    count = (CONVERGED_AFTER_MS + MEASURED_MS) // MODEL_WINDOW_MS
    return probe.run("init", f"windows:{count}:{MODEL_WINDOW_MS}:{kernels.grid}", env=kernels.env(limit))


@pytest.mark.parametrize("limit", [10, 30, 50, 90])
def test_modelled_gpu_time_converges_within_a_second_to_the_sm_limit(probe: Probe, limit: int) -> None:
    run = _modelled_windows(probe, WIDE, limit)
    achieved = _utilisation(run, CONVERGED_AFTER_MS)
    assert 0.9 * limit <= achieved <= 1.1 * limit, [w.fields for w in run.of("window")]


@pytest.mark.parametrize("limit", [10, 50])
def test_long_single_block_kernels_keep_to_the_sm_limit(probe: Probe, limit: int) -> None:
    run = _modelled_windows(probe, NARROW, limit)
    achieved = _utilisation(run, CONVERGED_AFTER_MS)
    assert 0.9 * limit <= achieved <= 1.1 * limit, [w.fields for w in run.of("window")]


@pytest.mark.parametrize(
    "util",
    [pytest.param("model", id="the GPU reported as this work makes it"), pytest.param("100", id="reported busy")],
)
def test_without_an_sm_limit_a_flat_out_launcher_keeps_the_modelled_gpu_busy(plain_probe: Probe, util: str) -> None:
    env = {**WIDE.env(100), "VGPU_STUB_UTIL": util}
    run = plain_probe.run("init", f"windows:5:{MODEL_WINDOW_MS}:{WIDE.grid}", env=env)
    assert _utilisation(run, MODEL_WINDOW_MS) >= 95, [w.fields for w in run.of("window")]


@pytest.mark.parametrize("kind", ["plain", "ex", "coop", "multi", "graph"])
def test_busy_gpu_trace_nearly_stops_every_kind_of_launch(probe: Probe, kind: str) -> None:
    run = probe.run("init", f"windows:5:{WINDOW_MS}:{BUSY_GRID}:{kind}", env=_throttled(10, util="100"))
    blocks = _blocks(run)
    assert blocks[-1] < blocks[0], blocks
    assert blocks[-1] <= BUSY_GRID, blocks  # one launch at most in the last window


@pytest.mark.parametrize("kind", ["plain", "ex", "coop", "graph"])
def test_per_thread_stream_launches_are_throttled_too(plain_probe: Probe, kind: str) -> None:
    """The _ptsz entry points, as cuGetProcAddress hands them to a program built for per-thread streams."""
    run = plain_probe.run(
        "init",
        f"windows:5:{WINDOW_MS}:{BUSY_GRID}:{kind}",
        env=_throttled(10, util="100"),
        via="procaddr",
        options=["--ptsz"],
    )
    blocks = _blocks(run)
    assert blocks[-1] < blocks[0], blocks
    assert blocks[-1] <= BUSY_GRID, blocks


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
    assert _blocks(pinned)[-1] <= 100, _blocks(pinned)  # one launch at most in the last window


def test_default_policy_follows_the_monitors_utilization_switch(plain_probe: Probe, cache: Path) -> None:
    env = _throttled(10, policy="default", util="100")
    with plain_probe.start("init", "wait", f"windows:4:{WINDOW_MS}:100", env=env) as session:
        session.wait_ready()
        spec.write_i32(cache, spec.UTILIZATION_SWITCH, 0)  # the monitor: this container is alone
        session.proceed()
        records, _ = session.finish()
    blocks = [r.num("blocks") for r in records if r.command == "window"]
    assert blocks[-1] > 1_000_000, blocks  # a 10 % limit on a busy GPU lets through a few hundred at most


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
    with plain_probe.start("init", f"windows:10:{WINDOW_MS}:{WIDE.grid}", env=WIDE.env(50)) as session:
        slot = eventually_sync(lambda: _busy_slot(cache), what="sm_util and hostpid published")
        session.finish()
    assert slot.hostpid == session.pid


def _busy_slot(cache: Path) -> spec.Slot | None:
    if not cache.exists() or cache.stat().st_size < spec.FILE_SIZE:
        return None  # not created yet
    slots = spec.read_cache(cache).live_slots()
    return next((s for s in slots if s.sm_util[0] > 0 and s.hostpid), None)
