"""Another benchmark of this folder, run side by side on this tree and on an earlier revision.

The earlier revision is checked out in a temporary git worktree; each arm runs that tree's own copy of the
benchmark with that tree's sources first on ``PYTHONPATH`` (the generated device-plugin stubs are copied
in, as the build would make them). The arms alternate, ``--rounds`` times, so both see the same load on a
shared machine; the figures are the medians of each arm's final JSON line, and ``ratio`` is this tree's
median over the earlier one's for every figure both report.

    python benchmarks/side_by_side.py [--against REV] [--rounds N] [--quick] [BENCHMARK.py [ARGS ...]]

e.g. ``python benchmarks/side_by_side.py --against HEAD~20 webhook.py --quick``. Without a benchmark it runs
``webhook.py``, against ``HEAD~1``; ``--quick`` is one run per arm, each given ``--quick`` (``make bench``).
The last line is JSON: ``{"benchmark": …, "against": …, "this": {…}, "before": {…}, "ratio": {…}}``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    "libs",
    "harness",
    *(f"services/{s}" for s in ("webhook", "extender", "allocator", "nodeagent", "metrics", "natsauth")),
)
GENERATED = Path("libs/hami_common/deviceplugin")
NATIVE = Path("native/vgpu")


def _run(tree: Path, script: str, args: list[str]) -> dict[str, Any]:
    # the real Kubernetes peers are this checkout's (pinned by tools/k8s, built by make k8s): a worktree has none
    peers = os.environ.get("HAMI_K8S_BIN") or str(ROOT / ".cache" / "k8s" / "bin")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / s) for s in SOURCES), "HAMI_K8S_BIN": peers}
    done = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / script), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{script} failed in {tree}: {(done.stderr or done.stdout).strip()[-800:]}")
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return {k: round(statistics.median(float(r[k]) for r in runs if k in r), 4) for k in keys}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--against", default="HEAD~1", help="the earlier git revision, e.g. HEAD~20")
    parser.add_argument("--rounds", type=int, default=3, help="runs per arm, alternating")
    parser.add_argument("--quick", action="store_true", help="one run per arm, the benchmark given --quick")
    parser.add_argument("benchmark", nargs="?", default="webhook.py", help="a script of benchmarks/")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    ns = parser.parse_args()
    if ns.quick:
        ns.rounds, ns.args = 1, ["--quick", *ns.args]
    scratch = Path(tempfile.mkdtemp(prefix="sidebyside"))
    before = scratch / "before"
    try:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), ns.against],
            check=True,
            capture_output=True,
        )
        for name in os.listdir(ROOT / GENERATED):
            if name.startswith("api_pb2"):
                shutil.copy2(ROOT / GENERATED / name, before / GENERATED / name)
        if (before / NATIVE / "Makefile").exists():  # the interposer the node pods install, from its own sources
            subprocess.run(
                ["make", "-s", "-C", str(before / NATIVE), "build/libvgpu.so"], check=True, capture_output=True
            )
        runs: dict[str, list[dict[str, Any]]] = {"this": [], "before": []}
        for i in range(ns.rounds):
            for arm, tree in (
                (("before", before), ("this", ROOT)) if i % 2 == 0 else (("this", ROOT), ("before", before))
            ):
                runs[arm].append(_run(tree, ns.benchmark, ns.args))
                print(f"round {i + 1} {arm}: {json.dumps(runs[arm][-1])}", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)], check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    this, earlier = _medians(runs["this"]), _medians(runs["before"])
    ratio = {k: round(this[k] / earlier[k], 3) for k in this if earlier.get(k)}
    print(f"{ns.benchmark} {' '.join(ns.args)}: medians of {ns.rounds} runs per arm; this tree over {ns.against}")
    for key, value in ratio.items():
        print(f"  {key:<36}{earlier[key]:>14}{this[key]:>14}{value:>10}")
    print(
        json.dumps({"benchmark": ns.benchmark, "against": ns.against, "this": this, "before": earlier, "ratio": ratio})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
