"""Cost of the node agent's usage scan: decoding shared-cache files and scanning a node's container directories.

Files are built by the independent test writer (``hami_sim.sharedcache_writer``) in a temporary directory:

* ``read_shared_cache`` of one v1.2 file with 1, 32 and 1024 process slots (16 devices each);
* ``scan_containers`` over a node with N container directories of 4 processes each (the whole blocking part
  of one scan period: list, find the file, decode it).

    python benchmarks/usage_scan.py [--quick] [--containers N]

The last line is JSON: per-file p50 in ms for each slot count, and the scan of N containers in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hami_common.sharedcache import read_shared_cache
from hami_nodeagent.usage import scan_containers
from hami_sim.sharedcache_writer import CacheSpec, Memory, ProcSpec, write_cache

MIB = 1024 * 1024
DEVICES = 16


def _spec(procs: int) -> CacheSpec:
    memory = {i: Memory(context=10 * MIB, data=(i + 1) * MIB) for i in range(DEVICES)}
    return CacheSpec(
        uuids=tuple(f"GPU-{i:08d}-0000-4000-8000-000000000000" for i in range(DEVICES)),
        limits=(3000 * MIB,) * DEVICES,
        sm_limits=(50,) * DEVICES,
        procs=tuple(ProcSpec(pid=100 + k, memory=memory, sm_util={0: 3}) for k in range(procs)),
    )


def _p50_ms(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="few rounds and containers (smoke run)")
    parser.add_argument("--containers", type=int, default=200, help="container directories on the scanned node")
    args = parser.parse_args()
    rounds = 3 if args.quick else 30
    containers = 10 if args.quick else args.containers
    result: dict[str, float | int] = {"rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="usagebench") as tmp:
        root = Path(tmp)
        print(f"read_shared_cache of one file, {DEVICES} devices (p50 over {rounds} rounds):")
        for procs in (1, 32, 1024):
            path = write_cache(root / "files" / f"{procs}.cache", _spec(procs))
            ms = _p50_ms(lambda p=path: read_shared_cache(p), rounds)  # type: ignore[misc]
            result[f"read_{procs}_procs_ms"] = round(ms, 3)
            print(f"  {procs:>5} processes  {ms:9.3f} ms")
        node = root / "containers"
        spec = _spec(4)
        for i in range(containers):
            write_cache(node / f"pod-{i:05d}_main" / "c.cache", spec)
        ms = _p50_ms(lambda: scan_containers(node), max(rounds // 3, 1))
        result["containers"] = containers
        result["scan_ms"] = round(ms, 3)
        print(f"scan_containers over {containers} containers (4 processes each): {ms:.1f} ms")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
