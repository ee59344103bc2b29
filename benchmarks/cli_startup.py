"""How long ``hami status`` takes from the shell, against a running local stack, side by side with an earlier
revision of the code (``--against REV``, checked out in a temporary git worktree and run with the same
interpreter and dependencies, its sources first on the path).

Each round runs every arm once, in turn, as a new process (a user typing the command): the whole command
(start-up, the three list calls, the table) and start-up alone (``python -c "import <the status module>"``).
The stack is the emulated one, 2 nodes, with the examples placed.

    python benchmarks/cli_startup.py [--quick] [--rounds N] [--against REV]

The last line is JSON: ``status_p50_s`` and ``import_p50_s`` per arm, and ``speedup`` (the earlier
revision's status median over this tree's) when ``--against`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = (
    "libs",
    "harness",
    *(f"services/{s}" for s in ("webhook", "extender", "allocator", "nodeagent", "metrics", "natsauth")),
)
READY = "adds pods"
GENERATED = Path("libs/hami_common/deviceplugin")
HAMI = (sys.executable, "-c", "import sys; from hami_cli.main import main; sys.exit(main())")  # whichever tree's


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(tree / s) for s in SOURCES)}


def _status_module(tree: Path) -> str:
    # before issue 31 the command lived in hami_cli.submit
    # and before issue 30 under libs/ rather than harness/
    places = (tree / "harness" / "hami_cli" / "main.py", tree / "libs" / "hami_cli" / "main.py")
    text = next(p for p in places if p.exists()).read_text()
    return "hami_cli.status" if "from hami_cli.status import status_main" in text else "hami_cli.submit"


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {done.stderr.strip()[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--against", help="a git revision to compare with, e.g. HEAD~5")
    args = parser.parse_args()
    rounds = 5 if args.quick else args.rounds
    scratch = Path(tempfile.mkdtemp(prefix="cli-startup-"))
    arms = {"this tree": ROOT}
    if args.against:
        before = scratch / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before), args.against],
                       check=True, capture_output=True)  # fmt: skip
        arms[args.against] = before
        for generated in (ROOT / GENERATED).glob("api_pb2*"):  # build outputs, not in git
            shutil.copy(generated, before / GENERATED / generated.name)
    workdir = scratch / "stack"
    up = subprocess.Popen(
        [*HAMI, "up", "--kube", "emulated", "--workdir", str(workdir), "--nodes", "2",
         "--gpus", "2", "--metrics-port", "0", "--for", "900"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    results: dict[str, dict[str, list[float]]] = {name: {"status": [], "import": []} for name in arms}
    try:
        assert up.stdout is not None
        for line in up.stdout:
            if READY in line:
                break
        else:
            raise SystemExit("hami up ended before it was ready")
        for _ in range(rounds):
            for name, tree in arms.items():
                env = _env(tree)
                results[name]["status"].append(_timed([*HAMI, "status", "--dir", str(workdir)], env))
                results[name]["import"].append(_timed([sys.executable, "-c", f"import {_status_module(tree)}"], env))
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=120)
        if args.against:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(scratch / "before")],
                           check=False, capture_output=True)  # fmt: skip
        shutil.rmtree(scratch, ignore_errors=True)
    summary: dict[str, object] = {"rounds": rounds}
    for name, figures in results.items():
        status_p50 = statistics.median(figures["status"])
        import_p50 = statistics.median(figures["import"])
        print(f"{name:>12}: hami status {status_p50:.3f} s (p50), start-up (imports) {import_p50:.3f} s (p50)")
        summary[name] = {"status_p50_s": round(status_p50, 3), "import_p50_s": round(import_p50, 3)}
    if args.against:
        speedup = statistics.median(results[args.against]["status"]) / statistics.median(results["this tree"]["status"])
        summary["speedup"] = round(speedup, 2)
        print(f"hami status is {speedup:.2f}x as fast as at {args.against}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
