"""Overhead of libvgpu.so over the stub driver, with and without the interposer side by side.

Measures, with native/vgpu/build/bench_hooks:
  * ns per cuMemAlloc_v2 + cuMemFree_v2 pair (a memory limit set, far from reached),
  * ns per cuLaunchKernel (no SM limit: the hot path),
  * us per launch over a process's first 20,000 single-block launches at a 50 % SM limit, the stub's kernels
    taking 1 us of modelled device time each (the limiter's slow start; ideal: 2 us),
  * ms from cuInit to the first successful allocation, measured inside each process, for 1, 8 and 64
    processes on one fresh shared-cache file. The processes are started first and then released
    together (they all wait on one pipe that is closed at once), so the 64 really do initialise at the
    same moment - a crowded start - instead of one after another as they happen to be forked.
The last line is a JSON summary. `--quick` shortens every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
VGPU: Final = ROOT / "native" / "vgpu"
BUILD: Final = VGPU / "build"
BENCH: Final = BUILD / "bench_hooks"


SLOW_START_ENV: Final = {
    "CUDA_DEVICE_SM_LIMIT": "50",
    "GPU_CORE_UTILIZATION_POLICY": "force",
    "VGPU_STUB_CAPACITY": "1000000",  # 1 us of modelled device time per block
}


def environment(cache: Path, interposed: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "LD_PRELOAD", "VGPU_", "GPU_CORE"))}
    env["LD_LIBRARY_PATH"] = str(BUILD / "stub")
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(cache)
    env["CUDA_DEVICE_MEMORY_LIMIT"] = "8g"
    env["VGPU_LIMITS_FILE"] = str(cache.with_suffix(".none"))
    if interposed:
        env["LD_PRELOAD"] = str(BUILD / "libvgpu.so")
    env.update(extra or {})
    return env


def per_call_ns(mode: str, count: int, cache: Path, interposed: bool, extra: dict[str, str] | None = None) -> float:
    out = subprocess.run(
        [str(BENCH), mode, str(count)],
        env=environment(cache, interposed, extra),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip())


def best_of(mode: str, count: int, cache: Path, interposed: bool, runs: int) -> float:
    """The fastest of a few processes: the machine is shared, so slower runs measure neighbours."""
    return min(per_call_ns(mode, count, cache, interposed) for _ in range(runs))


def init_ms(processes: int, cache: Path, fresh: bool = True) -> list[float]:
    """Start `processes` on one cache file (a fresh one unless `fresh` is false), wait until every one is
    parked at the barrier, then release them all at once; each reports its own cuInit-to-allocation time."""
    if fresh:
        cache.unlink(missing_ok=True)
    env = environment(cache, interposed=True)
    barrier_r, barrier_w = os.pipe()
    try:
        procs = [
            subprocess.Popen([str(BENCH), "init", "wait"], env=env, stdin=barrier_r, stdout=subprocess.PIPE, text=True)
            for _ in range(processes)
        ]
    finally:
        os.close(barrier_r)
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("bench_hooks init did not reach the barrier")
    finally:
        os.close(barrier_w)  # every process's read returns EOF now: the crowded start
    times = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"bench_hooks init exited {p.returncode}")
        times.append(float(out.strip()))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = parser.parse_args()
    if not BENCH.exists():
        subprocess.run(["make", "-s", "-C", str(VGPU)], check=True)
    allocs, launches, runs = (50_000, 500_000, 2) if args.quick else (300_000, 3_000_000, 4)

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "bench.cache"
        alloc = {i: best_of("alloc", allocs, cache, i, runs) for i in (False, True)}
        launch = {i: best_of("launch", launches, cache, i, runs) for i in (False, True)}
        print(f"{'':28}{'stub alone':>12}{'with libvgpu':>14}{'added':>10}")
        for label, pair in (("cuMemAlloc+cuMemFree (ns)", alloc), ("cuLaunchKernel (ns)", launch)):
            print(f"{label:28}{pair[False]:12.1f}{pair[True]:14.1f}{pair[True] - pair[False]:10.1f}")
        slow_start = min(per_call_ns("first", 20_000, cache, True, SLOW_START_ENV) for _ in range(runs)) / 1000
        print(f"slow start at a 50 % SM limit: {slow_start:.2f} us per launch over the first 20,000")

        # One process alone: the file's creator (the container's first CUDA process), and a later process
        # joining the container's existing file.
        create = [t for _ in range(7) for t in init_ms(1, cache)]
        join = [t for _ in range(7) for t in init_ms(1, cache, fresh=False)]
        print(f"init, 1 process creating the file:   median {statistics.median(create):.3f} ms")
        print(f"init, 1 process joining the file:    median {statistics.median(join):.3f} ms")
        init: dict[int, list[float]] = {1: join}
        for n in (8, 64):
            init[n] = init_ms(n, cache)
            print(
                f"init, {n:2} processes at once (fresh file): median {statistics.median(init[n]):.3f} ms, "
                f"max {max(init[n]):.3f} ms (cuInit to first allocation, per process)"
            )

    summary = {
        "alloc_overhead_ns": round(max(alloc[True] - alloc[False], 0.0), 1),
        "launch_overhead_ns": round(max(launch[True] - launch[False], 0.0), 1),
        "slow_start_us_per_launch": round(slow_start, 2),
        "init_ms_1": round(statistics.median(init[1]), 3),
        "init_ms_1_create": round(statistics.median(create), 3),
        "init_ms_8": round(statistics.median(init[8]), 3),
        "init_ms_64": round(statistics.median(init[64]), 3),
        "init_ms_64_median": round(statistics.median(init[64]), 3),
        "init_ms_64_max": round(max(init[64]), 3),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
