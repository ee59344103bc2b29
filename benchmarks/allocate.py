"""Allocate latency of the device plugin: staged answer versus the annotation fallback, side by side.

Everything runs over the real protocols and, as on a node, in separate processes: the plugin (this process)
on a unix socket, the kubelet's Allocate calls from a child process, the Kubernetes API emulator over HTTP.
Each round binds one pod the way the extender leaves it (annotations, bind-phase allocating); for the staged
path its answer is also written to the staging store.
The kubelet side calls GetPreferredAllocation before Allocate, as the kubelet does when the plugin offers
it; only the ``Allocate`` call is timed; the follow-up writes (erasure, bind-phase, lock) are awaited between
rounds, outside the timing, and the pod is then deleted so every round sees the same node.

    python benchmarks/allocate.py [--quick] [--rounds N]

The last line is JSON: ``staged_p50_ms``, ``staged_p99_ms``, ``fallback_p50_ms``, ``fallback_p99_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client, config

from hami_allocator.inventory import DeclaredInventory, Gpu
from hami_allocator.server import Endpoint
from hami_allocator.service import AllocatorService
from hami_common.allocation import NodeAllocationConfig, build_pod, from_annotation
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
    ContainerDevice,
    decode_pod_devices,
    encode_pod_devices,
)
from hami_common.deviceplugin.rpc import DevicePluginClient, pb, unix_target
from hami_common.kube import KubeClient, KubeSettings
from hami_common.resources import GPU
from hami_common.staging import StagedPod, StagingStore
from hami_sim.kubelet import KubeletEmulator
from hami_sim.waiting import eventually

NODE = "bench-node"
GPUS = tuple(f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(4))
SPLIT = 10
WARMUP = 5
QUIET_S = 0.02
SCRIPT = str(Path(__file__).resolve())


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _pod_body(name: str, value: str, bind_time: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {
                VGPU_NODE: NODE,
                BIND_TIME: str(bind_time),
                BIND_PHASE: BIND_PHASE_ALLOCATING,
                DEVICES_TO_ALLOCATE: value,
                DEVICES_ALLOCATED: value,
            },
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {GPU: "1"}}}],
        },
    }


async def _round(
    i: int,
    *,
    staged: bool,
    core: Any,
    store: StagingStore,
    alloc: NodeAllocationConfig,
    kubelet: _KubeletSide,
    service: AllocatorService,
) -> float:
    uuid = GPUS[i % len(GPUS)]
    value = encode_pod_devices([[ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=1000, usedcores=10)]])
    name = f"{'staged' if staged else 'fallback'}-{i}"
    created = await asyncio.to_thread(core.create_namespaced_pod, "default", _pod_body(name, value, i))
    uid = created.metadata.uid
    if staged:
        grant = from_annotation(
            pod_uid=uid, namespace="default", name=name, container_names=["main"], devices=decode_pod_devices(value)
        )
        staged_pod = StagedPod(
            pod_uid=uid,
            namespace="default",
            name=name,
            node=NODE,
            bind_time_ns=i,
            containers=build_pod(grant, alloc),
        )
        await asyncio.to_thread(store.put, staged_pod)  # the node agent is another process
    # The kubelet asks long after the pod's creation has settled: let the plugin's own watch see it first,
    # so the timing is of Allocate, not of this process digesting the create event.
    assert service.pods is not None
    cache = service.pods
    await eventually(lambda: cache.get("default", name), what="the plugin's watch saw the pod")
    await asyncio.sleep(QUIET_S)  # and the node has gone quiet, as it has by the time a kubelet admits a pod
    elapsed_ms, visible = await kubelet.allocate(f"{uuid}-0")
    assert visible == uuid, visible
    await service.followup.join()
    await asyncio.to_thread(core.delete_namespaced_pod, name, "default")
    return elapsed_ms


class _KubeletSide:
    """The kubelet's Allocate calls, from a process of their own as the kubelet's are: the child reads a
    device ID per line, calls Allocate over the plugin's socket, and answers ``<ms> <NVIDIA_VISIBLE_DEVICES>``."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, socket: str) -> _KubeletSide:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            SCRIPT,
            "--client",
            socket,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        return cls(proc)

    async def allocate(self, device_id: str) -> tuple[float, str]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{device_id}\n".encode())
        await self.proc.stdin.drain()
        line = (await self.proc.stdout.readline()).decode().split()
        if len(line) != 2:
            raise RuntimeError(f"the kubelet side failed: {line}")
        return float(line[0]), line[1]

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        await self.proc.wait()


async def _client(socket: str) -> None:
    """The child: per device ID read, what the kubelet does for a one-GPU container: GetPreferredAllocation,
    then Allocate (timed)."""
    loop = asyncio.get_running_loop()
    async with grpc.aio.insecure_channel(unix_target(socket)) as channel:
        plugin = DevicePluginClient(channel)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            device = line.strip()
            preferred = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=[device], allocation_size=1)
                ]
            )
            await plugin.preferred(preferred, deadline=30.0)
            request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[device])])
            started = time.perf_counter()
            try:
                answer = await plugin.allocate(request, deadline=30.0)
            except grpc.aio.AioRpcError as err:
                print(f"error {err.code().name}", flush=True)
                continue
            elapsed_ms = (time.perf_counter() - started) * 1000
            visible = answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
            print(f"{elapsed_ms:.4f} {visible}", flush=True)


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _populate(core: Any, node_pods: int, cluster_pods: int) -> None:
    """Pods that are not GPU pods: ``node_pods`` on the benchmark node (daemons, CPU workloads) and
    ``cluster_pods`` on other nodes, so the fallback's field-selected list works on a lived-in cluster."""
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    for i in range(node_pods + cluster_pods):
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"other-{i}", "namespace": "default"},
            "spec": {
                "nodeName": NODE if i < node_pods else f"node-{i % 50}",
                "containers": [{"name": "main", "image": "busybox"}],
            },
        }
        core.create_namespaced_pod("default", body)


def _start_apiserver(work: Path, cleanup: contextlib.ExitStack) -> Path:
    """The API emulator in a process of its own, as a real apiserver is: in this process its HTTP thread
    would hold the GIL and the timings would measure that, not the plugin."""
    kubeconfig = work / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hami_sim.kubeapi", "--port", "0", "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE,
        text=True,
    )
    cleanup.callback(proc.wait, 10)
    cleanup.callback(proc.terminate)
    assert proc.stdout is not None
    if not proc.stdout.readline():  # the emulator prints one line once it serves
        raise RuntimeError("the Kubernetes API emulator did not start")
    return kubeconfig


async def _bench(rounds: int, work: Path, node_pods: int, cluster_pods: int) -> dict[str, float]:
    times: dict[bool, list[float]] = {True: [], False: []}
    sockdir = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, sockdir, ignore_errors=True)
        kubeconfig = _start_apiserver(work, cleanup)
        api_client = cleanup.enter_context(config.new_client_from_config(str(kubeconfig)))  # type: ignore[no-untyped-call]
        core = client.CoreV1Api(api_client)
        await asyncio.to_thread(_populate, core, node_pods, cluster_pods)
        async with contextlib.AsyncExitStack() as stack:
            kube = await stack.enter_async_context(
                KubeClient.from_settings(KubeSettings(kubeconfig=str(kubeconfig), kube_timeout=10.0))
            )
            store = StagingStore(work / "staging")
            alloc = NodeAllocationConfig(hook_path=str(work / "hook"))
            endpoint = Endpoint(plugin_dir=sockdir, socket_name="bench.sock", resource_name=GPU, watch_interval=0.5)
            service = AllocatorService(
                node=NODE,
                endpoint=endpoint,
                inventory=DeclaredInventory(Gpu(u) for u in GPUS),
                store=store,
                config=alloc,
                split=SPLIT,
                kube=kube,
            )
            task = asyncio.create_task(service.run())
            stack.push_async_callback(_stop, task)
            kubelet = await stack.enter_async_context(KubeletEmulator(sockdir, node=NODE))
            await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
            kubelet_side = await _KubeletSide.start(str(sockdir / "bench.sock"))
            stack.push_async_callback(kubelet_side.close)
            for i in range(rounds + WARMUP):  # the first rounds warm both paths up, untimed
                for staged in (True, False):
                    ms = await _round(
                        i, staged=staged, core=core, store=store, alloc=alloc, kubelet=kubelet_side, service=service
                    )
                    if i >= WARMUP:
                        times[staged].append(ms)
            assert service.allocator.served_staged == rounds + WARMUP
            assert service.allocator.served_fallback == rounds + WARMUP
    staged_ms, fallback_ms = times[True], times[False]
    inside = service.allocator.latencies_ms
    return {
        "rounds": rounds,
        "node_pods": node_pods,
        "cluster_pods": cluster_pods,
        "staged_p50_ms": round(statistics.median(staged_ms), 3),
        "staged_p99_ms": round(_percentile(staged_ms, 0.99), 3),
        "fallback_p50_ms": round(statistics.median(fallback_ms), 3),
        "fallback_p99_ms": round(_percentile(fallback_ms, 0.99), 3),
        "plugin_staged_p50_ms": round(statistics.median(list(inside[True])[-rounds:]), 3),
        "plugin_fallback_p50_ms": round(statistics.median(list(inside[False])[-rounds:]), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a few rounds only (smoke run)")
    parser.add_argument("--client", metavar="SOCKET", help=argparse.SUPPRESS)  # the kubelet-side child
    parser.add_argument("--rounds", type=int, default=300, help="timed rounds per path")
    parser.add_argument("--node-pods", type=int, help="other pods bound to the benchmark node (30; quick: 10)")
    parser.add_argument("--cluster-pods", type=int, help="pods on other nodes of the cluster (300; quick: 30)")
    args = parser.parse_args()
    if args.client:
        asyncio.run(_client(args.client))
        return 0
    rounds = 20 if args.quick else args.rounds
    node_pods = args.node_pods if args.node_pods is not None else (10 if args.quick else 30)
    cluster_pods = args.cluster_pods if args.cluster_pods is not None else (30 if args.quick else 300)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="allocbench") as tmp:
        result = asyncio.run(_bench(rounds, Path(tmp), node_pods, cluster_pods))
    speedup = result["fallback_p50_ms"] / result["staged_p50_ms"] if result["staged_p50_ms"] else float("inf")
    print(
        f"Allocate latency over {rounds} rounds per path (ms); {node_pods} other pods on the node, "
        f"{cluster_pods} on other nodes:"
    )
    print(f"  {'path':<10}{'p50':>10}{'p99':>10}")
    print(f"  {'staged':<10}{result['staged_p50_ms']:>10.3f}{result['staged_p99_ms']:>10.3f}")
    print(f"  {'fallback':<10}{result['fallback_p50_ms']:>10.3f}{result['fallback_p99_ms']:>10.3f}")
    print(f"  staged is {speedup:.1f}x faster at p50, as the kubelet sees it")
    inside = result["plugin_fallback_p50_ms"] / max(result["plugin_staged_p50_ms"], 1e-9)
    print(
        f"  inside the plugin (request in to answer out): staged {result['plugin_staged_p50_ms']:.3f}, "
        f"fallback {result['plugin_fallback_p50_ms']:.3f} at p50 ({inside:.1f}x)"
    )

    print(json.dumps({**result, "speedup_p50": round(speedup, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
