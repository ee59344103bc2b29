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

``--kube real`` runs it on the real control plane (``make k8s``), as deploy/ ships it: kube-apiserver calls the
webhook and kube-scheduler calls the extender. The same run first measures the anchor: as many pods without
GPU requests, scheduled by the same kube-scheduler alone (the extender is not asked about pods that request
none of its managed resources), from creation to bound. Every GPU pod is timed twice: **to bound** (the
control plane's work: creation until the pod shows ``spec.nodeName``) and **to allocated** (with the node
side: until its kubelet has every ``Allocate`` answer). ``ratio_bound`` is GPU pods per second to bound over
the anchor's pods per second (``ratio_allocated`` the same to allocated). From kube-apiserver's own
``/metrics``, for both arms: requests per pod by verb and resource, writes per pod, and admission webhook
calls per pod. CPU is reported per pod for every process (``/proc``) and summed by side: the control plane
(etcd, kube-apiserver, kube-scheduler and every service of ours, NATS included), the nodes (the simulated
kubelets' processes and the node pods) and the benchmark's own client; ``cpu_ratio_control_plane`` is a GPU
pod's control-plane CPU over a plain pod's.
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
from hami_sim.apicalls import ApiCalls, api_calls, per_pod
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
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "plain"}},
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


class _Bound:
    """When each pod was first seen bound (``spec.nodeName`` set), from a pod watch of the benchmark's own."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.at: dict[str, float] = {}
        self._seen = asyncio.Event()
        self._cache = WatchCache(pod_source(cluster.kube), name="benchmark pods")
        self._cache.add_handler(self._on_pod)
        self._task: asyncio.Task[None] | None = None

    def _on_pod(self, change: Change[Pod]) -> None:
        if change.obj.spec.node_name and change.obj.metadata.uid not in self.at:
            self.at[change.obj.metadata.uid] = time.monotonic()
            self._seen.set()

    async def __aenter__(self) -> _Bound:
        self._task = asyncio.create_task(self._cache.run())
        await self._cache.synced.wait()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()

    async def wait(self, uids: list[str]) -> None:
        while not set(uids) <= self.at.keys():
            self._seen.clear()
            await self._seen.wait()


def _api_calls(cluster: LocalCluster) -> ApiCalls | None:
    """kube-apiserver's own counters (the real control plane only: the emulator keeps none)."""
    return None if cluster.real is None else api_calls(cluster.real.plane.metrics_text())


def _side(name: str) -> str:
    """Where a process's CPU is reported: the node side (simulated kubelets, node agents, allocators), the
    benchmark's own client, or the control plane (everything else, NATS and our services included)."""
    if name.startswith(("node host", "hami-node-")):
        return "nodes"
    if name.startswith("stack"):
        return "client"
    return "control_plane"


def _timings(
    prefix: str, uids: list[str], at: dict[str, float], start: dict[str, float], first: float
) -> dict[str, float]:
    latencies = [(at[uid] - start[uid]) * 1000 for uid in uids]
    return {
        f"{prefix}_pods_per_s": round(len(uids) / (max(at[uid] for uid in uids) - first), 1),
        f"{prefix}_p50_ms": round(statistics.median(latencies), 1),
        f"{prefix}_p90_ms": round(_percentile(latencies, 0.90), 1),
        f"{prefix}_p99_ms": round(_percentile(latencies, 0.99), 1),
        f"{prefix}_max_ms": round(max(latencies), 1),
    }


def _costs(prefix: str, pods: int, cpu: dict[str, float], calls: ApiCalls | None) -> dict[str, Any]:
    """CPU per pod by process and by side; the apiserver's requests and webhook calls per pod."""
    sides: dict[str, float] = {}
    for name, seconds in cpu.items():
        sides[_side(name)] = sides.get(_side(name), 0.0) + seconds
    found: dict[str, Any] = {
        f"{prefix}cpu_ms_per_pod": {name: round(seconds * 1000 / pods, 2) for name, seconds in sorted(cpu.items())},
        **{
            f"{prefix}cpu_ms_per_pod_{side}": round(seconds * 1000 / pods, 2) for side, seconds in sorted(sides.items())
        },
    }
    if calls is not None:
        found[f"{prefix}apiserver_writes_per_pod"] = round(calls.writes / pods, 2)
        found[f"{prefix}apiserver_requests_per_pod"] = per_pod(calls.requests, pods)
        found[f"{prefix}webhook_calls_per_pod"] = per_pod(calls.webhooks, pods)
    return found


async def _anchor(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, Any]:
    """The same number of pods without GPUs, scheduled by kube-scheduler alone: creation to bound, and what
    that cost every process and the apiserver."""
    processes = cluster.processes()
    cpu_before = {name: cpu_seconds(pid) for name, pid in processes.items()}
    calls_before = _api_calls(cluster)
    async with _Bound(cluster) as bound:
        uids, first = await _offer(cluster, [_plain_pod(f"plain-{i:04d}") for i in range(args.pods)], args)
        async with asyncio.timeout(args.timeout):
            await bound.wait(uids)
    calls_after = _api_calls(cluster)
    calls = None if calls_before is None or calls_after is None else calls_after - calls_before
    timings = _timings("baseline", uids, bound.at, cluster.submitted_at, first)
    return {
        "baseline_pods_per_s": timings["baseline_pods_per_s"],
        "baseline_p50_ms": timings["baseline_p50_ms"],
        "baseline_p99_ms": timings["baseline_p99_ms"],
        **_costs("baseline_", len(uids), cpu_used(cpu_before, processes), calls),
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
        calls_before = _api_calls(cluster)
        async with _Bound(cluster) as bound:
            uids, first = await _offer(cluster, mixed_workload(args.pods, prefix="bench"), args)
            submitted = time.monotonic() - first
            async with asyncio.timeout(args.timeout):
                admitted = await cluster.wait_admitted(uids)
                await bound.wait(uids)
        calls_after = _api_calls(cluster)
        cpu = cpu_used(cpu_before, processes)
        listed, _ = await cluster.kube.list_pods()
        report = audit(listed, admitted, cluster.capacity())
        refused = sum(1 for a in admitted.values() if not a.admission.ok)
        errors = [
            f"{a.admission.namespace}/{a.admission.name} on {a.node}: {c.name}: {c.error}"
            for a in admitted.values()
            for c in a.admission.containers
            if c.error
        ]
        for line in (errors + report.problems)[:10]:  # what went wrong, so a failed run can be read
            print(f"  ! {line}", flush=True)
    allocated_at = {uid: a.at for uid, a in admitted.items()}
    result: dict[str, Any] = {
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
        "elapsed_s": round(max(allocated_at.values()) - first, 2),
        "kube": args.kube,
        **_timings("bound", uids, bound.at, cluster.submitted_at, first),
        **_timings("allocated", uids, allocated_at, cluster.submitted_at, first),
        "allocate_errors": refused,
        "audit_problems": len(report.problems),
        **anchor,
    }
    calls = None if calls_before is None or calls_after is None else calls_after - calls_before
    result.update(_costs("", len(uids), cpu, calls))
    if anchor:
        result["ratio_bound"] = round(result["bound_pods_per_s"] / anchor["baseline_pods_per_s"], 2)
        result["ratio_allocated"] = round(result["allocated_pods_per_s"] / anchor["baseline_pods_per_s"], 2)
        plain = anchor["baseline_cpu_ms_per_pod_control_plane"]
        result["cpu_ratio_control_plane"] = round(result["cpu_ms_per_pod_control_plane"] / plain, 2) if plain else None
    return result


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
    _print(result)
    print(json.dumps(result))
    return 0


def _print(result: dict[str, Any]) -> None:
    print(f"{result['pods']} pods on {result['nodes']} nodes ({result['node_policy']} nodes, {result['kube']} kube):")
    print(f"  submitting took {result['submit_s']} s; the last pod allocated after {result['elapsed_s']} s")
    for phase in ("bound", "allocated"):
        spread = "   ".join(f"{q} {result[f'{phase}_{q}_ms']:.0f} ms" for q in ("p50", "p90", "p99", "max"))
        print(f"  to {phase:<9} {result[f'{phase}_pods_per_s']:>7.1f} pods/s   {spread}")
    print(f"  audit       {result['audit_problems']} problems, {result['allocate_errors']} Allocate errors")
    if "ratio_bound" in result:
        print(
            f"  anchor      {result['baseline_pods_per_s']:>7.1f} pods/s without GPUs, kube-scheduler alone "
            f"(p50 {result['baseline_p50_ms']:.0f} ms, p99 {result['baseline_p99_ms']:.0f} ms): "
            f"ratio_bound {result['ratio_bound']}, ratio_allocated {result['ratio_allocated']}"
        )
    if "apiserver_writes_per_pod" in result:
        print(
            f"  apiserver   {result['apiserver_writes_per_pod']} writes per GPU pod "
            f"(plain pod: {result['baseline_apiserver_writes_per_pod']})"
        )
        for key, count in result["apiserver_requests_per_pod"].items():
            print(f"    {count:>6.2f}  {key}   (plain: {result['baseline_apiserver_requests_per_pod'].get(key, 0)})")
        for key, count in result["webhook_calls_per_pod"].items():
            print(f"    {count:>6.2f}  webhook {key}")
    for side in ("control_plane", "nodes", "client"):
        if f"cpu_ms_per_pod_{side}" in result:
            plain = result.get(f"baseline_cpu_ms_per_pod_{side}")
            also = f"   (plain pod: {plain} ms)" if plain is not None else ""
            print(f"  cpu/pod     {result[f'cpu_ms_per_pod_{side}']:>8.2f} ms  {side}{also}")
    for name, ms in result["cpu_ms_per_pod"].items():
        print(f"  cpu/pod     {ms:>8.2f} ms    {name}")


if __name__ == "__main__":
    raise SystemExit(main())
