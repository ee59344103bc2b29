"""The shared-cache file: HAMi-core v1.2 layout, one limit for all processes of a container, and
recovery from processes that exit or are killed."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hami_sim.waiting import eventually_sync
from tests.native import _cache_file as spec
from tests.native._probe import OOM, GiB, MiB, Probe, Record, program

LIMIT_1G = {"CUDA_DEVICE_MEMORY_LIMIT": "1g"}


def test_file_has_the_hami_core_v1_2_layout_while_a_process_holds_memory(probe: Probe, cache: Path) -> None:
    env = {**LIMIT_1G, "CUDA_DEVICE_SM_LIMIT": "40", "CUDA_TASK_PRIORITY": "0"}
    with probe.start("init", "alloc:600m", "wait", env=env) as session:
        session.wait_ready()
        f = spec.read_cache(cache)
        session.proceed()
        session.finish()
    assert (f.size, f.magic, f.major, f.minor) == (spec.FILE_SIZE, spec.MAGIC, 1, 2)
    assert (f.limits[0], f.sm_limits[0], f.priority) == (GiB, 40, 0)
    assert (f.utilization_switch, f.recent_kernel) == (1, 2)
    (slot,) = f.live_slots()
    assert (slot.pid, slot.status) == (session.pid, 1)
    assert slot.total[0] == slot.data_size[0] == 600 * MiB


def test_exited_process_leaves_no_usage_behind(probe: Probe, cache: Path) -> None:
    probe.run("init", "alloc:600m", env=LIMIT_1G)
    f = spec.read_cache(cache)
    assert f.usage() == 0
    assert f.live_slots() == ()
    assert probe.run("init", "alloc:1g", env=LIMIT_1G).one("alloc").rc == 0


def test_two_processes_share_one_limit(probe: Probe) -> None:
    with probe.start("init", "alloc:600m", "wait", env=LIMIT_1G) as first:
        first.wait_ready()
        second = probe.run("init", "meminfo", "alloc:600m", "alloc:400m", env=LIMIT_1G)
        first.proceed()
        first.finish()
    assert second.one("meminfo").num("free") == GiB - 600 * MiB
    assert [r.rc for r in second.of("alloc")] == [OOM, 0]
    assert probe.run("init", "alloc:1g", env=LIMIT_1G).one("alloc").rc == 0


def test_killed_process_memory_is_reclaimed(probe: Probe, cache: Path) -> None:
    with probe.start("init", "alloc:900m", "wait", env=LIMIT_1G) as victim:
        victim.wait_ready()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=30)
    assert spec.read_cache(cache).usage() == 900 * MiB  # the corpse's charge is still in the file
    run = probe.run("init", "alloc:900m", env=LIMIT_1G)
    assert run.one("alloc").rc == 0
    assert spec.read_cache(cache).usage() == 0


@contextmanager
def _lock_held(cache: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the shared cache's lock, as libvgpu takes it, until killed."""
    holder = subprocess.Popen([str(program("lock_holder")), str(cache)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()


def _kill(holder: subprocess.Popen[str]) -> None:
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)


def test_creator_killed_while_holding_the_lock_does_not_wedge_the_container(probe: Probe, cache: Path) -> None:
    """The file exists but is not initialised and its creator holds the lock: a new process waits for it
    (it may be about to finish), and once it is killed, creates the region itself."""
    with _lock_held(cache) as holder, probe.start("init", "alloc:100m", env=LIMIT_1G) as blocked:
        assert blocked.next_line(timeout=0.5) is None  # creating the region needs the lock
        assert cache.stat().st_size == 0  # and nobody initialises it behind the holder's back
        _kill(holder)
        init = blocked.until("init")
        records, _ = blocked.finish()
    assert isinstance(init, Record)
    assert init.rc == 0
    assert [r.rc for r in records if r.command == "alloc"] == [0]
    assert spec.read_cache(cache).limits[0] == GiB


def test_lock_held_by_a_killed_process_does_not_wedge_the_container(probe: Probe, cache: Path) -> None:
    """A process killed while it held the lock (deciding an allocation near the limit) does not stop the
    next decision: the kernel drops the lock with its holder."""
    probe.run("init", env=LIMIT_1G)  # creates the file
    with _lock_held(cache) as holder, probe.start("init", "alloc:1100m", "alloc:100m", env=LIMIT_1G) as blocked:
        init = blocked.until("init")  # joining an initialised file takes no lock
        blocked.until("device")
        assert blocked.next_line(timeout=0.5) is None  # a request over the limit is decided under it
        _kill(holder)
        records, _ = blocked.finish()
    assert isinstance(init, Record)
    assert init.rc == 0
    assert [r.rc for r in records if r.command == "alloc"] == [OOM, 0]


def test_file_written_by_an_older_hami_core_is_used_with_its_limit(probe: Probe, cache: Path) -> None:
    spec.write_hami_core_v11(cache, limit=GiB)
    run = probe.run("init", "alloc:600m", "alloc:600m")  # no limit in this process's environment
    assert [r.rc for r in run.of("alloc")] == [0, OOM]
    assert (spec.read_cache(cache).major, spec.read_cache(cache).minor) == (1, 1)


def test_process_slots_are_reused_not_grown(probe: Probe, cache: Path) -> None:
    for _ in range(3):
        probe.run("init", "alloc:1m", env=LIMIT_1G)
    assert spec.read_cache(cache).proc_num <= 1


def _with_devices(cache: Path) -> spec.CacheFile | None:
    f = spec.read_cache(cache)
    return f if f.device_num else None


def test_first_process_records_device_uuids_for_the_monitor(probe: Probe, cache: Path) -> None:
    with probe.start("init", "wait", env=LIMIT_1G) as session:
        session.wait_ready()
        f = eventually_sync(lambda: _with_devices(cache), what="device_num written")
        session.proceed()
        session.finish()
    assert f.device_num == 1
    assert f.uuid0.startswith("GPU-")


def _slot_with_hostpid(cache: Path) -> spec.Slot | None:
    return next((s for s in spec.read_cache(cache).live_slots() if s.hostpid), None)


def test_hostpid_and_last_kernel_time_are_filled_at_cuinit_before_any_launch(probe: Probe, cache: Path) -> None:
    """HAMi's monitor maps a container's processes by hostpid and reads last_kernel_time from the start
    (HAMi-core fills both at cuInit), not from the first kernel launch."""
    with probe.start("init", "alloc:100m", "wait", env=LIMIT_1G) as session:
        session.wait_ready()
        slot = eventually_sync(lambda: _slot_with_hostpid(cache), what="hostpid published without a launch")
        f = spec.read_cache(cache)
        session.proceed()
        session.finish()
    assert slot.hostpid == session.pid  # the stub reports no PID namespace: host PID = PID
    assert f.last_kernel_time > 0
