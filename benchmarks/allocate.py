"""Allocate latency of the device plugin: staged answer versus the annotation fallback, side by side.

Everything runs over the real protocols and, as on a node, in separate processes: the plugin (this process,
on uvloop as the service runs) on a unix socket, the kubelet's calls from a child process, the Kubernetes
API emulator over HTTP in a process of its own. Each round binds one pod the way the extender leaves it
(annotations, bind-phase allocating); for the staged path its answer is also written to the staging store.
The kubelet side calls GetPreferredAllocation before Allocate, as the kubelet does when the plugin offers
it; only the ``Allocate`` call is timed; the follow-up writes (erasure, bind-phase, lock) are awaited between
rounds, outside the timing, and the pod is then deleted so every round sees the same node.

A third arm, ``checked``, is the staged path with the kubelet's PodResources socket configured (deploy/'s
setting): before each Allocate the plugin asks ``List`` which pod is being admitted, from a process of its
own as the kubelet serves it, listing the round's pod waiting and the node's other pods holding devices.
``check_cost_p50`` is checked over staged at p50.

Two more figures say where the time goes. ``plugin_*_p50_ms`` is the plugin's own work (request in to
answer out) and ``*_transport_p50_ms`` the rest of each call: gRPC's round trip and both processes waking.
``floor_p50_ms`` is the same call, from the same child, to a plugin that answers at once with a canned
answer of the same size: no plugin can be faster than that on this machine with these gRPC stacks.

    python benchmarks/allocate.py [--quick] [--rounds N]

The last line is JSON: ``staged_p50_ms``, ``staged_p99_ms``, ``fallback_p50_ms``, ``fallback_p99_ms``,
``checked_p50_ms``, ``checked_p99_ms``, ``check_cost_p50``, ``floor_p50_ms`` and the figures above.
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
import msgspec
from kubernetes import client, config

from hami_allocator.inventory import DeclaredInventory, Gpu
from hami_allocator.plugin import to_pb
from hami_allocator.server import Endpoint
from hami_allocator.service import AllocatorService
from hami_common.allocation import NodeAllocationConfig, build_pod, from_annotation
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    GRANT_SIGNATURE,
    VGPU_NODE,
    ContainerDevice,
    decode_pod_devices,
    encode_pod_devices,
)
from hami_common.deviceplugin.rpc import DevicePluginServicer, add_device_plugin, pb, unix_target
from hami_common.grants import GrantKey
from hami_common.kube import KubeClient, KubeSettings
from hami_common.podresources import ListedContainer, ListedPod, PodResourcesClient, add_lister
from hami_common.resources import GPU
from hami_common.service import run_loop
from hami_common.staging import StagedPod, StagingStore
from hami_sim.kubelet import KubeletEmulator
from hami_sim.waiting import eventually

NODE = "bench-node"
GPUS = tuple(f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(4))
SPLIT = 10
GRANT_KEY = GrantKey(b"the benchmark's grant key, as the extender and allocator share one")
WARMUP = 5
QUIET_S = 0.02
SCRIPT = str(Path(__file__).resolve())
PREFERRED_METHOD = "/v1beta1.DevicePlugin/GetPreferredAllocation"
ALLOCATE_METHOD = "/v1beta1.DevicePlugin/Allocate"


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
    listing: tuple[Path, list[ListedPod]] | None = None,
    core: Any,
    store: StagingStore,
    alloc: NodeAllocationConfig,
    kubelet: _KubeletSide,
    service: AllocatorService,
) -> tuple[float, float]:
    """One pod bound and allocated; (ms as the kubelet sees it, ms inside the plugin)."""
    uuid = GPUS[i % len(GPUS)]
    value = encode_pod_devices([[ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=1000, usedcores=10)]])
    name = f"{'checked' if listing else 'staged' if staged else 'fallback'}-{i}"
    created = await asyncio.to_thread(core.create_namespaced_pod, "default", _pod_body(name, value, i))
    uid = created.metadata.uid
    # signed as the extender signs once the UID is known: the fallback serves only grants it signed
    signed = {"metadata": {"annotations": {GRANT_SIGNATURE: GRANT_KEY.sign(uid, NODE, value)}}}
    await asyncio.to_thread(core.patch_namespaced_pod, name, "default", signed)
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
    if listing is not None:  # what the kubelet lists while admitting the pod: it waits, beside the node's others
        waiting = ListedPod("default", name, (ListedContainer("main"),))
        await asyncio.to_thread(listing[0].write_bytes, msgspec.json.encode([*listing[1], waiting]))
    await asyncio.sleep(QUIET_S)  # and the node has gone quiet, as it has by the time a kubelet admits a pod
    elapsed_ms, visible = await kubelet.allocate(service.server.endpoint.socket, f"{uuid}-0")
    assert visible == uuid, visible
    inside_ms = service.allocator.latencies_ms[staged][-1]
    await service.followup.join()
    await asyncio.to_thread(core.delete_namespaced_pod, name, "default")
    return elapsed_ms, inside_ms


def _node_listing(node_pods: int) -> list[ListedPod]:
    """The node's other pods as the kubelet lists them (:func:`_populate`'s, CPU only: no devices)."""
    return [ListedPod("default", f"other-{j}", (ListedContainer("main"),)) for j in range(node_pods)]


def _lister(socket: str, listing: str) -> None:
    """The child serving the kubelet's PodResources List: the pods the parent wrote to ``listing``."""

    async def pods() -> list[ListedPod]:
        # a small file read in place, as the kubelet answers from memory: no thread hop in the List's latency
        return msgspec.json.decode(Path(listing).read_bytes(), type=list[ListedPod])  # noqa: ASYNC240

    async def serve() -> None:
        server = grpc.aio.server()
        add_lister(server, pods)
        server.add_insecure_port(unix_target(socket))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(serve())


async def _start_lister(socket: Path, listing: Path, stack: contextlib.AsyncExitStack) -> PodResourcesClient:
    await asyncio.to_thread(listing.write_bytes, b"[]")
    proc = await asyncio.create_subprocess_exec(sys.executable, SCRIPT, "--lister", str(socket), str(listing))

    async def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        await proc.wait()

    stack.push_async_callback(stop)

    def serving() -> bool:
        if proc.returncode is not None:
            raise RuntimeError(f"the PodResources lister exited {proc.returncode} before serving")
        return socket.exists()

    await eventually(serving, timeout=60, what="the PodResources lister serving")
    lister = PodResourcesClient(str(socket))
    stack.push_async_callback(lister.close)
    return lister


async def _floor_round(i: int, socket: Path, kubelet: _KubeletSide) -> float:
    """The same call to a plugin that answers at once, with a canned answer: gRPC's own round trip."""
    uuid = GPUS[i % len(GPUS)]
    await asyncio.sleep(QUIET_S)
    elapsed_ms, visible = await kubelet.allocate(socket, f"{uuid}-0")
    assert visible == GPUS[0], visible
    return elapsed_ms


class _Canned(DevicePluginServicer):  # type: ignore[misc]
    """A device plugin with nothing to decide: one prepared answer for every request."""

    def __init__(self, answer: pb.ContainerAllocateResponse) -> None:
        self.answer = pb.AllocateResponse(container_responses=[answer])

    async def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        ids = request.container_requests[0].available_deviceIDs[:1]
        return pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=ids)]
        )

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:  # noqa: N802
        return self.answer


async def _serve_canned(socket: Path, alloc: NodeAllocationConfig, stack: contextlib.AsyncExitStack) -> None:
    grant = from_annotation(
        pod_uid="canned",
        namespace="default",
        name="canned",
        container_names=["main"],
        devices=((ContainerDevice(uuid=GPUS[0], type="NVIDIA", usedmem=1000, usedcores=10),),),
    )
    server = grpc.aio.server()
    add_device_plugin(server, _Canned(to_pb(build_pod(grant, alloc)[0].response)))
    server.add_insecure_port(unix_target(str(socket)))
    await server.start()
    stack.push_async_callback(server.stop, None)


class _KubeletSide:
    """The kubelet's Allocate calls, from a process of their own as the kubelet's are: the child reads
    ``<socket> <device ID>`` per line, calls the plugin there, and answers ``<ms> <NVIDIA_VISIBLE_DEVICES>``."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> _KubeletSide:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            SCRIPT,
            "--client",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        return cls(proc)

    async def allocate(self, socket: Path, device_id: str) -> tuple[float, str]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        try:
            self.proc.stdin.write(f"{socket} {device_id}\n".encode())
            await self.proc.stdin.drain()
        except (RuntimeError, ConnectionError) as err:
            code = await asyncio.wait_for(self.proc.wait(), 5)
            raise RuntimeError(f"the kubelet side is gone (exit {code}): {err}") from None
        line = (await self.proc.stdout.readline()).decode().split()
        if len(line) != 2:
            raise RuntimeError(f"the kubelet side failed: {line}")
        return float(line[0]), line[1]

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        await self.proc.wait()


class _Plugin:
    """The kubelet's client of one plugin socket: blocking calls on one channel kept open, as the kubelet's
    Go client makes them (an asyncio client would add its own event-loop hops to every figure, and those
    are the client's cost, not the plugin's)."""

    def __init__(self, socket: str) -> None:
        self.channel = grpc.insecure_channel(unix_target(socket))
        self.preferred = self.channel.unary_unary(
            PREFERRED_METHOD,
            request_serializer=pb.PreferredAllocationRequest.SerializeToString,
            response_deserializer=pb.PreferredAllocationResponse.FromString,
        )
        self.allocate = self.channel.unary_unary(
            ALLOCATE_METHOD,
            request_serializer=pb.AllocateRequest.SerializeToString,
            response_deserializer=pb.AllocateResponse.FromString,
        )


def _client() -> None:
    """The child: per line read, what the kubelet does for a one-GPU container: GetPreferredAllocation,
    then Allocate (timed)."""
    plugins: dict[str, _Plugin] = {}
    for line in sys.stdin:
        socket, device = line.split()
        plugin = plugins.get(socket) or plugins.setdefault(socket, _Plugin(socket))
        preferred = pb.PreferredAllocationRequest(
            container_requests=[pb.ContainerPreferredAllocationRequest(available_deviceIDs=[device], allocation_size=1)]
        )
        plugin.preferred(preferred, timeout=30.0)
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=[device])])
        started = time.perf_counter()
        try:
            answer = plugin.allocate(request, timeout=30.0)
        except grpc.RpcError as err:
            print(f"error {err.code().name}", flush=True)
            continue
        elapsed_ms = (time.perf_counter() - started) * 1000
        visible = answer.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]
        print(f"{elapsed_ms:.4f} {visible}", flush=True)
    for plugin in plugins.values():
        plugin.channel.close()


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
    transport: dict[bool, list[float]] = {True: [], False: []}  # as seen minus inside the plugin
    checked: list[float] = []
    checked_inside: list[float] = []
    floor: list[float] = []
    sockdir = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, sockdir, ignore_errors=True)
        kubeconfig = _start_apiserver(work, cleanup)
        api_client = cleanup.enter_context(config.new_client_from_config(str(kubeconfig)))  # type: ignore[no-untyped-call]
        core = client.CoreV1Api(api_client)
        await asyncio.to_thread(_populate, core, node_pods, cluster_pods)
        async with contextlib.AsyncExitStack() as stack:
            # The two children first, while this process runs no gRPC thread yet: forked beside gRPC's
            # threads, a child could crash between fork and exec (seen as exit -11 now and then).
            kubelet_side = await _KubeletSide.start()
            stack.push_async_callback(kubelet_side.close)
            listing = work / "listing.json"
            # not in sockdir: the kubelet emulator started below owns that folder
            lister = await _start_lister(work / "pod-resources.sock", listing, stack)
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
                grant_key=GRANT_KEY,
            )
            task = asyncio.create_task(service.run())
            stack.push_async_callback(_stop, task)
            kubelet = await stack.enter_async_context(KubeletEmulator(sockdir, node=NODE))
            await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
            floor_socket = sockdir / "canned.sock"
            await _serve_canned(floor_socket, alloc, stack)
            others = _node_listing(node_pods)
            for i in range(rounds + WARMUP):  # the first rounds warm every path up, untimed
                for staged in (True, False):
                    seen, plugin_ms = await _round(
                        i, staged=staged, core=core, store=store, alloc=alloc, kubelet=kubelet_side, service=service
                    )
                    if i >= WARMUP:
                        times[staged].append(seen)
                        transport[staged].append(seen - plugin_ms)
                service.allocator.kubelet_pods = lister.list
                seen, plugin_ms = await _round(
                    i,
                    staged=True,
                    listing=(listing, others),
                    core=core,
                    store=store,
                    alloc=alloc,
                    kubelet=kubelet_side,
                    service=service,
                )
                service.allocator.kubelet_pods = None
                if i >= WARMUP:
                    checked.append(seen)
                    checked_inside.append(plugin_ms)
                floor_ms = await _floor_round(i, floor_socket, kubelet_side)
                if i >= WARMUP:
                    floor.append(floor_ms)
            assert service.allocator.served_staged == 2 * (rounds + WARMUP)
            assert service.allocator.refused_unknown == 0
            assert service.allocator.served_fallback == rounds + WARMUP
    staged_ms, fallback_ms = times[True], times[False]
    inside = service.allocator.latencies_ms
    return {
        "floor_p50_ms": round(statistics.median(floor), 3),
        "staged_transport_p50_ms": round(statistics.median(transport[True]), 3),
        "fallback_transport_p50_ms": round(statistics.median(transport[False]), 3),
        "rounds": rounds,
        "node_pods": node_pods,
        "cluster_pods": cluster_pods,
        "staged_p50_ms": round(statistics.median(staged_ms), 3),
        "staged_p99_ms": round(_percentile(staged_ms, 0.99), 3),
        "fallback_p50_ms": round(statistics.median(fallback_ms), 3),
        "fallback_p99_ms": round(_percentile(fallback_ms, 0.99), 3),
        "checked_p50_ms": round(statistics.median(checked), 3),
        "checked_p99_ms": round(_percentile(checked, 0.99), 3),
        "plugin_checked_p50_ms": round(statistics.median(checked_inside), 3),
        "check_cost_p50": round(statistics.median(checked) / max(statistics.median(staged_ms), 1e-9), 3),
        "plugin_staged_p50_ms": round(statistics.median(list(inside[True])[-rounds:]), 3),
        "plugin_fallback_p50_ms": round(statistics.median(list(inside[False])[-rounds:]), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a few rounds only (smoke run)")
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)  # the kubelet-side child
    parser.add_argument("--lister", nargs=2, help=argparse.SUPPRESS)  # the PodResources child: socket, listing
    parser.add_argument("--rounds", type=int, default=300, help="timed rounds per path")
    parser.add_argument("--node-pods", type=int, help="other pods bound to the benchmark node (30; quick: 10)")
    parser.add_argument("--cluster-pods", type=int, help="pods on other nodes of the cluster (300; quick: 30)")
    args = parser.parse_args()
    if args.client:
        _client()
        return 0
    if args.lister:
        _lister(*args.lister)
        return 0
    rounds = 20 if args.quick else args.rounds
    node_pods = args.node_pods if args.node_pods is not None else (10 if args.quick else 30)
    cluster_pods = args.cluster_pods if args.cluster_pods is not None else (30 if args.quick else 300)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="allocbench") as tmp:
        result = run_loop(_bench(rounds, Path(tmp), node_pods, cluster_pods))  # the plugin's loop, as it runs
    speedup = result["fallback_p50_ms"] / result["staged_p50_ms"] if result["staged_p50_ms"] else float("inf")
    print(
        f"Allocate latency over {rounds} rounds per path (ms); {node_pods} other pods on the node, "
        f"{cluster_pods} on other nodes:"
    )
    print(f"  {'path':<10}{'p50':>10}{'p99':>10}")
    print(f"  {'staged':<10}{result['staged_p50_ms']:>10.3f}{result['staged_p99_ms']:>10.3f}")
    print(f"  {'fallback':<10}{result['fallback_p50_ms']:>10.3f}{result['fallback_p99_ms']:>10.3f}")
    print(f"  {'checked':<10}{result['checked_p50_ms']:>10.3f}{result['checked_p99_ms']:>10.3f}")
    print(f"  staged is {speedup:.1f}x faster at p50, as the kubelet sees it")
    print(
        f"  asking the kubelet's PodResources List which pod it admits costs {result['check_cost_p50']:.2f}x the "
        f"staged p50 (inside the plugin: {result['plugin_checked_p50_ms']:.3f} ms)"
    )
    inside = result["plugin_fallback_p50_ms"] / max(result["plugin_staged_p50_ms"], 1e-9)
    print(
        f"  inside the plugin (request in to answer out): staged {result['plugin_staged_p50_ms']:.3f}, "
        f"fallback {result['plugin_fallback_p50_ms']:.3f} at p50 ({inside:.1f}x)"
    )
    print(
        f"  the rest, the gRPC round trip and both processes waking: staged {result['staged_transport_p50_ms']:.3f}, "
        f"fallback {result['fallback_transport_p50_ms']:.3f} at p50"
    )
    print(
        f"  floor: the same call to a plugin answering at once with a canned answer, {result['floor_p50_ms']:.3f} "
        f"at p50; staged is {result['staged_p50_ms'] / max(result['floor_p50_ms'], 1e-9):.2f}x that"
    )
    print(json.dumps({**result, "speedup_p50": round(speedup, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
