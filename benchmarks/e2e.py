"""End to end: pods per second and latency from admission to the kubelet's last ``Allocate``.

The whole local cluster (``hami_sim.stack.LocalCluster``): embedded NATS, the API emulator (a child
process), the webhook over HTTPS, the extender, the metrics service and the kube-scheduler stand-in in this
process, and N simulated nodes (node agent, allocator, kubelet emulator) in ``--node-hosts`` child processes.
Pods are submitted through the webhook, ``--concurrency`` at a time, as clients would; a pod's latency runs
from the start of its admission to the moment its kubelet has every ``Allocate`` answer. Throughput is pods
over the time from the first submission to the last allocation. Afterwards every pod is audited (devices as
annotated, no GPU over-committed). Default: 1,000 pods on 100 nodes × 8 GPUs; ``--quick``: 100 pods on 10.

    python benchmarks/e2e.py [--quick] [--pods N] [--nodes N] [--gpus N] [--node-policy spread|binpack]
                             [--rate R] [--chaos] [--kube emulated|real]

By default the pods come as one burst, so latency is mostly the queue; ``--rate R`` offers R pods per
second instead, which shows a pod's own path when the stack keeps up. ``--chaos`` runs the chaos case at
full size instead: the pods are submitted in five batches with NATS, a node agent, the extender and the API
emulator restarted between them, and three pods that fit nowhere; its JSON says how many were allocated,
never admitted or mis-allocated (exit 1 unless all is well).

``--kube real`` runs it on the real control plane (``make k8s``): kube-apiserver calls the webhook and
kube-scheduler calls the extender. The same run first measures the anchor: as many pods without GPU
requests, scheduled by the same kube-scheduler alone (the extender is not asked about pods that request
none of its managed resources), from creation to bound. ``ratio`` is GPU pods per second (creation to the
last ``Allocate``, a later end than bound) over the anchor's pods per second. CPU is reported per GPU pod
for every process of the stack (``/proc``), so the apiserver's and kube-scheduler's share shows apart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hami_common.kube import Change, Pod, WatchCache, pod_source
from hami_common.service import run_loop
from hami_sim.cpu import cpu_seconds, cpu_used
from hami_sim.stack import LocalCluster, StackConfig
from hami_sim.stack.audit import audit, gpu_pod, mixed_workload
from hami_sim.stack.chaos import run_with_chaos


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _config(args: argparse.Namespace, workdir: Path, sockdir: Path) -> StackConfig:
    return StackConfig(
        workdir=workdir,
        sockdir=sockdir,
        nodes=args.nodes,
        gpus_per_node=args.gpus,
        node_policy=args.node_policy,
        node_hosts=args.node_hosts,
        kube=args.kube,
    )


def _plain_pod(name: str) -> dict[str, Any]:
    """A pod without GPU requests for hami-scheduler: kube-scheduler places it without asking the extender."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main", "image": "busybox"}]},
    }


async def _offer(
    cluster: LocalCluster, pods: list[dict[str, Any]], args: argparse.Namespace
) -> tuple[list[str], float]:
    """Submit ``pods`` ``--concurrency`` at a time (or at ``--rate``); their uids and when the first went."""
    gate = asyncio.Semaphore(args.concurrency)
    first = time.monotonic()

    async def submit(index: int, pod: dict[str, Any]) -> str:
        if args.rate > 0:  # an offered load: pod i is sent at i / rate, not as fast as the gate allows
            await asyncio.sleep(max(0.0, first + index / args.rate - time.monotonic()))
        async with gate:
            created = await cluster.submit(pod)
        return str(created["metadata"]["uid"])

    return list(await asyncio.gather(*(submit(i, pod) for i, pod in enumerate(pods)))), first


async def _anchor(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    """The same number of pods without GPUs, scheduled by kube-scheduler alone: creation to bound."""
    bound_at: dict[str, float] = {}
    seen = asyncio.Event()

    def on_pod(change: Change[Pod]) -> None:
        if change.obj.spec.node_name and change.obj.metadata.uid not in bound_at:
            bound_at[change.obj.metadata.uid] = time.monotonic()
            seen.set()

    cache = WatchCache(pod_source(cluster.kube), name="anchor pods")
    cache.add_handler(on_pod)
    watching = asyncio.create_task(cache.run())
    try:
        await cache.synced.wait()
        uids, first = await _offer(cluster, [_plain_pod(f"plain-{i:04d}") for i in range(args.pods)], args)
        async with asyncio.timeout(args.timeout):
            while not set(uids) <= bound_at.keys():
                seen.clear()
                await seen.wait()
    finally:
        watching.cancel()
    latencies = [(bound_at[uid] - cluster.submitted_at[uid]) * 1000 for uid in uids]
    elapsed = max(bound_at[uid] for uid in uids) - first
    return {
        "baseline_pods_per_s": round(len(uids) / elapsed, 1),
        "baseline_p50_ms": round(statistics.median(latencies), 1),
        "baseline_p99_ms": round(_percentile(latencies, 0.99), 1),
    }


async def _bench(args: argparse.Namespace, workdir: Path, sockdir: Path) -> dict[str, Any]:
    config = _config(args, workdir, sockdir)
    started = time.monotonic()
    async with LocalCluster(config) as cluster:
        startup = time.monotonic() - started
        print(f"cluster of {args.nodes} nodes × {args.gpus} GPUs ready in {startup:.1f}s", flush=True)
        anchor = await _anchor(cluster, args) if args.kube == "real" else {}
        processes = cluster.processes()
        cpu_before = {name: cpu_seconds(pid) for name, pid in processes.items()}
        uids, first = await _offer(cluster, mixed_workload(args.pods, prefix="bench"), args)
        submitted = time.monotonic() - first
        async with asyncio.timeout(args.timeout):
            admitted = await cluster.wait_admitted(uids)
        last = max(a.at for a in admitted.values())
        elapsed = last - first
        latencies = [(admitted[uid].at - cluster.submitted_at[uid]) * 1000 for uid in uids]
        listed, _ = await cluster.kube.list_pods()
        report = audit(listed, admitted, cluster.capacity())
        refused = sum(1 for a in admitted.values() if not a.admission.ok)
        cpu = cpu_used(cpu_before, processes)
    pods_per_s = len(uids) / elapsed
    if anchor:
        anchor["ratio"] = round(pods_per_s / anchor["baseline_pods_per_s"], 2)
    return {
        "benchmark": "e2e",
        "pods": len(uids),
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "node_policy": args.node_policy,
        "node_hosts": args.node_hosts,
        "concurrency": args.concurrency,
        "offered_rate": args.rate,
        "startup_s": round(startup, 2),
        "submit_s": round(submitted, 2),
        "elapsed_s": round(elapsed, 2),
        "kube": args.kube,
        "pods_per_s": round(pods_per_s, 1),
        "p50_ms": round(statistics.median(latencies), 1),
        "p90_ms": round(_percentile(latencies, 0.90), 1),
        "p99_ms": round(_percentile(latencies, 0.99), 1),
        "max_ms": round(max(latencies), 1),
        "allocate_errors": refused,
        "audit_problems": len(report.problems),
        **anchor,
        "cpu_ms_per_pod": {name: round(seconds * 1000 / len(uids), 2) for name, seconds in sorted(cpu.items())},
    }


async def _chaos(args: argparse.Namespace, workdir: Path, sockdir: Path) -> dict[str, Any]:
    """The chaos case at full size: NATS, a node agent, the extender and the API emulator restart mid-run."""
    config = _config(args, workdir, sockdir)
    async with LocalCluster(config) as cluster:
        first = config.node_names()[0]
        disruptions = [
            cluster.restart_nats,
            lambda: cluster.restart_nodeagent(first),
            cluster.restart_extender,
            cluster.restart_api,
        ]
        unfit = [gpu_pod(f"too-big-{i}", mem=config.gpu_memory_mib * 2) for i in range(3)]
        outcome = await run_with_chaos(
            cluster, mixed_workload(args.pods, prefix="chaos"), disruptions, unfit,
            settle=args.timeout, concurrency=args.concurrency,
        )  # fmt: skip
    for line in (outcome.never_admitted + outcome.report.problems + outcome.bound_not_admitted)[:10]:
        print(f"  ! {line}")
    return {
        "benchmark": "e2e-chaos",
        "pods": len(outcome.uids),
        "nodes": args.nodes,
        "disruptions": ["nats", "nodeagent", "extender", "apiserver"],
        "allocated": outcome.report.allocated,
        "never_admitted": len(outcome.never_admitted),
        "allocate_errors": len(outcome.refused),
        "audit_problems": len(outcome.report.problems),
        "bound_not_admitted": len(outcome.bound_not_admitted),
        "unfit_pending_with_reason": len(outcome.unfit_reasons),
        "unfit_without_reason": outcome.unfit_without_reason,
        "service_failures": sum(len(v) for v in outcome.failures.values()),
        "elapsed_s": round(outcome.elapsed_s, 1),
        "ok": outcome.ok,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="100 pods on 10 nodes")
    parser.add_argument("--pods", type=int)
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=32, help="admissions in flight at once")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="offer pods at this many per second (0: a burst, as fast as admitted)"
    )
    parser.add_argument("--node-policy", default="spread", choices=("spread", "binpack"))
    parser.add_argument(
        "--node-hosts", type=int, default=1, help="child processes running the simulated nodes (0: in this process)"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait for the last allocation")
    parser.add_argument(
        "--kube", default="emulated", choices=("emulated", "real"), help="real: kube-apiserver and kube-scheduler"
    )
    parser.add_argument(
        "--chaos", action="store_true", help="restart NATS, a node agent, the extender and the API emulator mid-run"
    )
    args = parser.parse_args(argv)
    args.pods = args.pods or (100 if args.quick else 1000)
    args.nodes = args.nodes or (10 if args.quick else 100)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="e2ebench") as tmp, tempfile.TemporaryDirectory(prefix="hb-") as socks:
        if args.chaos:
            result = run_loop(_chaos(args, Path(tmp), Path(socks)))
            print(
                f"{result['pods']} pods on {result['nodes']} nodes with {', '.join(result['disruptions'])} restarted:"
            )
            print(f"  allocated {result['allocated']}, never admitted {result['never_admitted']}, "
                  f"audit problems {result['audit_problems']}, unfit pods pending with a reason "
                  f"{result['unfit_pending_with_reason']}/3, {result['elapsed_s']} s")  # fmt: skip
            print(json.dumps(result))
            return 0 if result["ok"] else 1
        result = run_loop(_bench(args, Path(tmp), Path(socks)))
    print(f"{result['pods']} pods on {result['nodes']} nodes ({result['node_policy']} nodes, admission to Allocate):")
    took = f"({result['elapsed_s']} s, submitting took {result['submit_s']} s)"
    print(f"  throughput  {result['pods_per_s']:>8.1f} pods/s   {took}")
    spread = "   ".join(f"{q} {result[q + '_ms']:.0f} ms" for q in ("p50", "p90", "p99", "max"))
    print(f"  latency     {spread}")
    print(f"  audit       {result['audit_problems']} problems, {result['allocate_errors']} Allocate errors")
    if "ratio" in result:
        print(
            f"  anchor      {result['baseline_pods_per_s']:>8.1f} pods/s without GPUs, kube-scheduler alone "
            f"(p50 {result['baseline_p50_ms']:.0f} ms, p99 {result['baseline_p99_ms']:.0f} ms): ratio {result['ratio']}"
        )
    for name, ms in result["cpu_ms_per_pod"].items():
        print(f"  cpu/pod     {ms:>8.2f} ms  {name}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
