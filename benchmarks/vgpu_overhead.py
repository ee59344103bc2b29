"""Overhead of libvgpu.so over the stub driver, with and without the interposer side by side.

Measures, with native/vgpu/build/bench_hooks:
  * ns per cuMemAlloc_v2 + cuMemFree_v2 pair (a memory limit set, far from reached),
  * ns per cuLaunchKernel (no SM limit: the hot path),
  * us per launch over a process's first 20,000 single-block launches at a 50 % SM limit, the stub's kernels
    taking 1 us of modelled device time each (the limiter's slow start; ideal: 2 us),
  * ms from cuInit to the first successful allocation, measured inside each process, for 1, 8 and 64
    processes on one fresh shared-cache file. The processes are started first and then released
    together (they all wait on one pipe that is closed at once), so the 64 really do initialise at the
    same moment - a crowded start - instead of one after another as they happen to be forked. The 64
    are released several times over (a fresh file each time); the median and the max are over every
    process of every round. Each process also counts its context switches in the measured span:
    voluntary ones are waits (a lock), involuntary ones are the scheduler running another of the 64
    (or anything else on the machine) meanwhile, which is where a slow start's time goes when it waits
    for nothing.
  * `--baseline LIB` adds the crowded start with another build of libvgpu.so (an older commit), the
    two alternating round by round so that both see the same machine.
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
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class Start:
    """One process's initialisation: milliseconds, and the context switches while it ran."""

    ms: float
    waits: int  # voluntary context switches
    preempted: int  # involuntary ones


def environment(
    cache: Path, interposed: bool, extra: dict[str, str] | None = None, library: Path = BUILD / "libvgpu.so"
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "LD_PRELOAD", "VGPU_", "GPU_CORE"))}
    env["LD_LIBRARY_PATH"] = str(BUILD / "stub")
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(cache)
    env["CUDA_DEVICE_MEMORY_LIMIT"] = "8g"
    env["VGPU_LIMITS_FILE"] = str(cache.with_suffix(".none"))
    if interposed:
        env["LD_PRELOAD"] = str(library)
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


def init_starts(processes: int, cache: Path, fresh: bool = True, library: Path = BUILD / "libvgpu.so") -> list[Start]:
    """Start `processes` on one cache file (a fresh one unless `fresh` is false), wait until every one is
    parked at the barrier, then release them all at once; each reports its own cuInit-to-allocation time."""
    if fresh:
        cache.unlink(missing_ok=True)
    env = environment(cache, interposed=True, library=library)
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
    starts = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        if p.returncode != 0:
            raise RuntimeError(f"bench_hooks init exited {p.returncode}")
        ms, waits, preempted = out.split()
        starts.append(Start(float(ms), int(waits), int(preempted)))
    return starts


def init_ms(processes: int, cache: Path, fresh: bool = True) -> list[float]:
    return [s.ms for s in init_starts(processes, cache, fresh)]


def crowd_line(label: str, starts: list[Start]) -> str:
    ms = [s.ms for s in starts]
    waited = sum(1 for s in starts if s.waits)
    preempted = sum(1 for s in starts if s.preempted)
    return (
        f"{label}: median {statistics.median(ms):.3f} ms, max {max(ms):.3f} ms over {len(ms)} processes; "
        f"{waited} waited, {preempted} were preempted"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    parser.add_argument("--baseline", type=Path, help="another libvgpu.so to compare the crowded start with")
    args = parser.parse_args()
    if not BENCH.exists():
        subprocess.run(["make", "-s", "-C", str(VGPU)], check=True)
    allocs, launches, runs = (50_000, 500_000, 2) if args.quick else (300_000, 3_000_000, 4)
    rounds = 2 if args.quick else 6

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
        init: dict[int, list[float]] = {1: join, 8: init_ms(8, cache)}
        print(f"init, 8 processes at once (fresh file): median {statistics.median(init[8]):.3f} ms")
        crowd: list[Start] = []
        baseline: list[Start] = []
        for _ in range(rounds):
            crowd += init_starts(64, cache)
            if args.baseline:
                baseline += init_starts(64, cache, library=args.baseline.resolve())
        init[64] = [s.ms for s in crowd]
        print(crowd_line("init, 64 processes at once (fresh file)", crowd))
        if args.baseline:
            print(crowd_line(f"  the same with {args.baseline}", baseline))

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
        "init_64_waited": sum(1 for s in crowd if s.waits),
        "init_64_preempted": sum(1 for s in crowd if s.preempted),
    }
    if args.baseline:
        summary["baseline_init_ms_64_median"] = round(statistics.median(s.ms for s in baseline), 3)
        summary["baseline_init_ms_64_max"] = round(max(s.ms for s in baseline), 3)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
