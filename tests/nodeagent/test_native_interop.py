"""The reader against a cache file written by this project's libvgpu.so (native/vgpu, over its stub driver)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hami_common.sharedcache import read_shared_cache, write_feedback
from tests.native._probe import BUILD, VGPU_DIR, GiB, MiB, Probe


@pytest.fixture(scope="module")
def built() -> None:
    if not (BUILD / "vgpu_probe").exists():
        if shutil.which("make") is None or shutil.which("cc") is None:
            pytest.skip("no C toolchain to build native/vgpu")
        subprocess.run(["make", "-s", "-C", str(VGPU_DIR)], check=True)


def test_file_written_by_libvgpu_decodes_to_what_the_process_holds(built: None, tmp_path: Path) -> None:
    cache = tmp_path / "vgpu.cache"
    env = {"CUDA_DEVICE_MEMORY_LIMIT": "1g", "CUDA_DEVICE_SM_LIMIT": "40", "CUDA_TASK_PRIORITY": "0"}
    with Probe("plain", cache).start("init", "alloc:600m", "wait", env=env) as session:
        session.wait_ready()
        held = read_shared_cache(cache)
        write_feedback(cache, recent_kernel=-1, utilization_switch=0)
        session.proceed()
        session.finish()
    assert (held.format, held.priority, held.proc_num) == ("v1.2", 0, 1)
    device = held.devices[0]
    assert device.uuid
    assert (device.used_bytes, device.limit_bytes, device.sm_limit_percent) == (600 * MiB, GiB, 40)
    (process,) = held.processes
    assert (process.pid, process.status, process.consistent) == (session.pid, 1, True)
    after = read_shared_cache(cache)
    assert (after.recent_kernel, after.utilization_switch) == (-1, 0)
    assert after.devices[0].used_bytes == 0  # the process exited and released its memory
