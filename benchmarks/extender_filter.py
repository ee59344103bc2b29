"""/filter latency and filter+bind throughput of the extender, over real HTTP, at cluster scale.

A Kubernetes API emulator (its own process) is seeded with 5,000 nodes of 8 GPUs each and 10 resident pods
per node, already placed (HAMi annotations, Running). The extender (its own process, as ``hami-extender``)
builds its ledger from the watches; NATS is an embedded nats-server. Nodes are in a cluster's steady
state: their kubelet reports the GPUs as allocatable and the scheduler's handshake is there. The benchmark
then plays kube-scheduler: ``POST /filter`` for pending pods, one at a time, listing every node name
(nodeCacheCapable) -- or the first 1,000 for the ``1000x8`` figures -- and times each request. Like the
local stack's scheduler stand-in, it speaks through ``hami_sim.http``'s lean HTTP/1.1 client, since
kube-scheduler is a Go program whose client costs next to nothing; ``--httpx`` uses httpx instead, to
show what a general Python client adds to each figure. For
throughput it filters one pod at a time and binds in parallel (up to 32 in flight), answering for each
node's allocator with the AllocationResult on NATS that ends the node hand-off.

Figures, per size (``<nodes>x8``), after a short warm-up:

* ``filter_p50_ms`` / ``filter_p99_ms``: the HTTP round trip as the client sees it, minus the time the
  extender waited on the apiserver for its annotation patch (the extender reports it in ``Server-Timing``).
  The emulator is far slower than an apiserver on kept-alive connections, so it is taken out here;
* ``filter_with_apiserver_p50_ms`` / ``..._p99_ms``: the raw round trip, emulator included;
* ``handler_p50_ms`` / ``handler_p99_ms``: inside the extender, request read to response, minus the patch;
* ``binds_per_s``: filter+bind pairs per second (the emulator's latency bounds it).

    python benchmarks/extender_filter.py [--quick] [--httpx] [--mig] [--vendors] [--nodes N]

``--quick`` seeds one resident pod per node instead of 10 and sends fewer requests (well under a minute).
``--mig`` runs twice in one invocation: the plain cluster, then the same cluster with every tenth node in MIG
mode (8 H100s cut into instances; its resident pods hold 1g instances and their reservations); the MIG run's
figures carry the suffix ``_mig``, and ``filter_p50_mig_ratio_…`` / ``filter_p99_mig_ratio_…`` compare the two.
The pending pods name no ``nvidia.com/vgpu-mode``, so MIG nodes are candidates like the others (binpack prefers
them: a 1g instance books more memory than the resident pods on shared cards).
``--vendors`` also runs a mixed cluster: the extender is given a device config enabling Ascend, Cambricon
and Hygon, and every tenth node carries, beside its 8 GPUs, one family's devices in turn (8 Ascend 910B3
NPUs with their register annotation, 2 Cambricon MLUs in node capacity, or 8 Hygon DCUs), each with the
scheduler's handshake already answered, as the NVIDIA nodes are).
The pending pods still ask NVIDIA slices; the run's figures carry the suffix ``_vendors`` and
``filter_p50_vendors_ratio_…`` / ``filter_p99_vendors_ratio_…`` compare it with the NVIDIA-only run.
The last line is JSON with ``filter_p50_ms_5000x8``, ``filter_p99_ms_5000x8``, ``filter_p99_ms_1000x8``,
``binds_per_s`` and the other figures above.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from hami_common import subjects
from hami_common.annotations import (
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    MIG_ALLOCATIONS,
    NODE_HANDSHAKE,
    NODE_REGISTER,
    NODE_SCHEDULER_POLICY,
    VGPU_NODE,
    ContainerDevice,
    DeviceInfo,
    MigAllocation,
    encode_handshake,
    encode_mig_allocations,
    encode_node_devices,
    encode_pod_devices,
)
from hami_common.annotations.registration import MigPlacement, MigProfile
from hami_common.bus import Bus, EmbeddedNats
from hami_common.events import AllocationResult
from hami_common.resources import GPU
from hami_common.service import run_loop
from hami_common.settings import BusSettings
from hami_common.vendors.ascend import CHART_CHIPS
from hami_common.vendors.ascend import keys as ascend_keys
from hami_common.vendors.ascend.register import RegisteredNpu
from hami_common.vendors.ascend.register import encode_register as encode_npus
from hami_common.vendors.cambricon import keys as cambricon_keys
from hami_common.vendors.hygon import encode_register as encode_dcus
from hami_common.vendors.hygon import keys as hygon_keys
from hami_sim.http import HttpClient, HttpError, HttpReply

GPUS_PER_NODE = 8
RESIDENT_PER_NODE = 10
NAMESPACE = "bench"
MIG_EVERY = 10  # --mig: every tenth node is a MIG node (10 %)
VENDOR_EVERY = 10  # --vendors: every tenth node also carries another family's devices (10 %)
ASCEND_WORD = "Ascend910B3"
# what the chart enables for the three families (Ascend needs its switch, as HAMi's --enable-ascend)
VENDORS_CONFIG = "vnpus:\n  enabled: true\ncambricon: {}\nhygon: {}\n"


def _family_devices(name: str, which: int) -> tuple[dict[str, str], dict[str, str]]:
    """The annotations and capacity a family's device plugin adds to a node: Ascend, Cambricon or Hygon."""
    # the same steady state as the NVIDIA nodes': the scheduler's Requesting_<time> is there, so the run
    # measures filtering, not the extender's first handshake write to every family node
    reported = encode_handshake(datetime.now().astimezone())
    if which == 0:
        npus = tuple(
            RegisteredNpu(
                id=f"{name}-npu{i}",
                index=i,
                count=4,
                devmem=65536,
                devcore=20,
                type=ASCEND_WORD,
                health=True,
                custominfo={ascend_keys.NETWORK_ID: i // 4},
            )
            for i in range(8)
        )
        annotations = {
            ascend_keys.register_key(ASCEND_WORD): encode_npus(npus),
            ascend_keys.handshake_key(ASCEND_WORD): reported,
        }
        chip = next(c for c in CHART_CHIPS if c.common_word == ASCEND_WORD)
        return annotations, {chip.resource_name: "32"}
    if which == 1:
        return {}, {cambricon_keys.MLU_CORES: "200", cambricon_keys.MLU_MEMORY: "192"}
    dcus = [
        DeviceInfo(
            id=f"{name}-dcu{i}",
            index=i,
            count=4,
            devmem=65536,
            devcore=100,
            type="DCU-K100",
            mode="hami-core",
            health=True,
        )
        for i in range(8)
    ]
    return {hygon_keys.NODE_REGISTER: encode_dcus(dcus), hygon_keys.NODE_HANDSHAKE: reported}, {
        hygon_keys.DCU_COUNT: "32"
    }


def _mig_profile(
    name: str, memory: int, core: int, slices: int, starts: range | tuple[int, ...], size: int
) -> MigProfile:
    placements = tuple(MigPlacement(start=s, size=size) for s in starts)
    return MigProfile(name=name, memory_mb=memory, core=core, slice_count=slices, placements=placements)


# An H100 80GB's MIG profiles as NVML lists them (memory MiB; placements in memory slices).
H100_PROFILES = (
    _mig_profile("1g.10gb", 9856, 14, 1, range(7), 1),
    _mig_profile("1g.20gb", 19968, 14, 1, (0, 2, 4, 6), 2),
    _mig_profile("2g.20gb", 19968, 28, 2, (0, 2, 4), 2),
    _mig_profile("3g.40gb", 40192, 42, 3, (0, 4), 4),
    _mig_profile("4g.40gb", 40192, 57, 4, (0,), 4),
    _mig_profile("7g.80gb", 80384, 100, 7, (0,), 8),
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _gpu(node: str, i: int) -> str:
    return f"GPU-{node}-{i}"


def _seed_and_serve(
    nodes: int,
    resident: int,
    pending: int,
    workdir: str,
    ready: Any,
    stop: Any,
    mig_every: int = 0,
    vendor_every: int = 0,
) -> None:
    """The emulator process: seed the store directly (fast), serve over HTTP until told to stop.

    With ``mig_every``, every such node is in MIG mode and each resident pod there holds a 1g instance."""
    from hami_sim.kubeapi import KubeApiEmulator, Store, find_resource

    class PagingStore(Store):
        """The emulator's store, minus one cost that is not the apiserver's: its list deep-copies every
        object for each page of a paginated list (quadratic in the number of pods); objects in the store
        are replaced, never changed in place, so a list can hand out references."""

        def list_matching(self, *args: Any) -> Any:
            with self._lock:
                return list(self._select(*args)), self._rv

    pods_rt = find_resource("", "v1", "pods")
    nodes_rt = find_resource("", "v1", "nodes")
    ns_rt = find_resource("", "v1", "namespaces")
    assert pods_rt is not None
    assert nodes_rt is not None
    assert ns_rt is not None
    api = KubeApiEmulator(bookmark_interval=5.0, history=200_000)
    api.store = PagingStore(history=200_000)
    with api:
        store = api.store
        store.create(ns_rt, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        handshake = encode_handshake(datetime.now().astimezone())
        for n in range(nodes):
            name = f"node-{n:05d}"
            mig = bool(mig_every) and n % mig_every == 0
            devices = [
                DeviceInfo(
                    id=_gpu(name, i),
                    index=i,
                    count=7 if mig else 10,
                    devmem=81920,
                    devcore=100,
                    type="NVIDIA-H100",
                    numa=i // 4,
                    mode="mig" if mig else "hami-core",
                    mig_profiles=H100_PROFILES if mig else (),
                    health=True,
                )
                for i in range(GPUS_PER_NODE)
            ]
            # a cluster in its steady state: the kubelet reports the GPUs, the scheduler's handshake is there
            slots = str(sum(d.count for d in devices))
            annotations = {NODE_REGISTER: encode_node_devices(devices), NODE_HANDSHAKE: handshake}
            capacity = {GPU: slots}
            if vendor_every and n % vendor_every == vendor_every // 2:
                extra, resources = _family_devices(name, (n // vendor_every) % 3)
                annotations.update(extra)
                capacity.update(resources)
            store.create(
                nodes_rt,
                None,
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "annotations": annotations},
                    "status": {"capacity": capacity, "allocatable": dict(capacity)},
                },
            )
            for p in range(resident):
                gpu = _gpu(name, p % GPUS_PER_NODE)
                mem, cores = (H100_PROFILES[0].memory_mb, H100_PROFILES[0].core) if mig else (4096, 10)
                grant = encode_pod_devices([[ContainerDevice(gpu, "NVIDIA", mem, cores)]])
                annotations = {VGPU_NODE: name, DEVICES_ALLOCATED: grant, DEVICES_TO_ALLOCATE: grant}
                if mig:  # 1g instances from the top of the card down, as the extender places them
                    placement = MigPlacement(start=6 - p // GPUS_PER_NODE, size=1)
                    reservation = MigAllocation(
                        container_index=0, device_index=0, gpu_uuid=gpu, profile="1g.10gb", placement=placement
                    )
                    annotations[MIG_ALLOCATIONS] = encode_mig_allocations([reservation])
                store.create(
                    pods_rt,
                    NAMESPACE,
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": f"res-{n}-{p}", "namespace": NAMESPACE, "annotations": annotations},
                        "spec": {"nodeName": name, "containers": [_container(4096)]},
                        "status": {"phase": "Running"},
                    },
                )
        uids = []
        for p in range(pending):
            created = store.create(pods_rt, NAMESPACE, _pending_pod(p, ""))
            uids.append(created["metadata"]["uid"])
        kubeconfig = api.write_kubeconfig(Path(workdir) / "kubeconfig")
        ready.put((str(kubeconfig), uids))
        stop.wait()


def _container(mem: int) -> dict[str, Any]:
    return {
        "name": "main",
        "image": "cuda",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": "10"}},
    }


class _HttpxClient:
    """httpx behind the lean client's two calls, for ``--httpx``: what a general Python client adds."""

    def __init__(self, base_url: str) -> None:
        self._client = httpx.AsyncClient(base_url=base_url, timeout=120.0)

    async def get(self, path: str) -> HttpReply:
        return self._reply(await self._client.get(path))

    async def post(self, path: str, body: bytes) -> HttpReply:
        return self._reply(await self._client.post(path, content=body, headers={"content-type": "application/json"}))

    async def aclose(self) -> None:
        await self._client.aclose()

    @staticmethod
    def _reply(response: httpx.Response) -> HttpReply:
        return HttpReply(response.status_code, dict(response.headers), response.content)


Client = HttpClient | _HttpxClient


async def _wait_ready(client: Client, nodes: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            ready = (await client.get("/readyz")).json()
            if ready["synced"] and ready["nodes"] == nodes:
                return
        except (HttpError, httpx.HTTPError):
            pass
        await asyncio.sleep(0.2)  # a benchmark's set-up poll, not a test
    raise SystemExit(f"the extender did not sync {nodes} nodes in time")


def _pending_pod(p: int, uid: str) -> dict[str, Any]:
    meta = {"name": f"pending-{p}", "namespace": NAMESPACE, **({"uid": uid} if uid else {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"schedulerName": "hami-scheduler", "containers": [_container(2000)]},
    }


async def _run(
    nodes: int,
    resident: int,
    filters: int,
    binds: int,
    nats: EmbeddedNats,
    log_dir: Path,
    use_httpx: bool,
    mig_every: int = 0,
    vendor_every: int = 0,
) -> dict[str, float]:
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    with tempfile.TemporaryDirectory() as workdir:
        t0 = time.monotonic()
        pending = 2 * filters + binds
        emulator = ctx.Process(
            target=_seed_and_serve, args=(nodes, resident, pending, workdir, ready, stop, mig_every, vendor_every)
        )
        emulator.start()
        kubeconfig, uids = ready.get(timeout=600)
        figures = {"nodes": float(nodes), "resident_per_node": float(resident), "seed_s": time.monotonic() - t0}
        port = _free_port()
        suffix = ("-mig" if mig_every else "") + ("-vendors" if vendor_every else "")
        log_file = (log_dir / f"extender-{nodes}{suffix}.log").open("w")
        code = "import sys; from hami_extender.main import main; sys.exit(main(sys.argv[1:]))"
        argv = [
            sys.executable,
            "-c",
            code,
            "--kubeconfig",
            kubeconfig,
            "--http-port",
            str(port),
            "--nats-url",
            nats.url,
            "--kube-timeout",
            "60",
            "--sync-wait",
            "60",
            "--identity",
            "bench",
            "--handoff-wait",
            "60",
        ]
        if vendor_every:
            config = Path(workdir) / "device-config.yaml"
            config.write_text(VENDORS_CONFIG)
            argv += ["--device-config-file", str(config)]
        extender = subprocess.Popen(  # noqa: ASYNC220 - started once, before anything is timed
            argv, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, "OTEL_SDK_DISABLED": "true"}
        )
        try:
            base = f"http://127.0.0.1:{port}"
            client: Client = _HttpxClient(base) if use_httpx else HttpClient(base, timeout=120.0)
            try:
                t1 = time.monotonic()
                await _wait_ready(client, nodes, time.monotonic() + 900)
                figures["sync_s"] = time.monotonic() - t1
                names = [f"node-{n:05d}" for n in range(nodes)]
                for count, first in ((min(1000, nodes), 0), (nodes, filters)):
                    figures.update(await _latency(client, names[:count], range(first, first + filters), uids))
                figures["binds_per_s"] = await _throughput(client, names, range(2 * filters, pending), nats, uids)
                return figures
            finally:
                await client.aclose()
        finally:
            extender.terminate()
            extender.wait(30)
            log_file.close()
            stop.set()
            emulator.join(30)


async def _post_filter(client: Client, pod: dict[str, Any], names: list[str]) -> HttpReply:
    return await client.post("/filter", json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode())


async def _latency(client: Client, names: list[str], pods: range, uids: list[str]) -> dict[str, float]:
    """Sequential filters; each timed end to end, and without the apiserver patch (``Server-Timing``)."""
    total: list[float] = []
    own: list[float] = []
    handler: list[float] = []
    for p in pods:
        body = json.dumps({"Pod": _pending_pod(p, uids[p]), "Nodes": None, "NodeNames": names}).encode()
        start = time.perf_counter()
        response = await client.post("/filter", body)
        elapsed = (time.perf_counter() - start) * 1000
        result = response.json()
        if result["Error"] or not result["NodeNames"]:
            raise SystemExit(f"filter failed: {result['Error'] or result['FailedNodes']}")
        timings = dict(part.strip().split(";dur=") for part in response.headers["server-timing"].split(","))
        total.append(elapsed)
        own.append(elapsed - float(timings["apiserver"]))
        handler.append(float(timings["filter"]) - float(timings["apiserver"]))
    skip = min(5, len(own) // 10)  # the first requests warm caches and connections
    total, own, handler = total[skip:], own[skip:], handler[skip:]
    suffix = f"{len(names)}x{GPUS_PER_NODE}"
    return {
        f"handler_p50_ms_{suffix}": statistics.median(handler),
        f"handler_p99_ms_{suffix}": _percentile(handler, 0.99),
        f"filter_p50_ms_{suffix}": statistics.median(own),
        f"filter_p99_ms_{suffix}": _percentile(own, 0.99),
        f"filter_with_apiserver_p50_ms_{suffix}": statistics.median(total),
        f"filter_with_apiserver_p99_ms_{suffix}": _percentile(total, 0.99),
    }


async def _throughput(client: Client, names: list[str], pods: range, nats: EmbeddedNats, uids: list[str]) -> float:
    """kube-scheduler's pace: filters one at a time, binds in parallel (its binding cycles are
    asynchronous); the benchmark answers for each node's allocator on NATS, which ends the hand-off."""
    slots = asyncio.Semaphore(32)
    async with await Bus.connect(BusSettings(nats_url=nats.url, service_name="bench")) as bus:

        async def bind(p: int, node: str) -> None:
            async with slots:
                name = f"pending-{p}"
                body = {"PodName": name, "PodNamespace": NAMESPACE, "PodUID": uids[p], "Node": node}
                bound = (await client.post("/bind", json.dumps(body).encode())).json()
                if bound["Error"]:
                    raise SystemExit(f"bind failed: {bound['Error']}")
                result = AllocationResult(
                    pod_uid=uids[p],
                    namespace=NAMESPACE,
                    name=name,
                    node=node,
                    container="main",
                    ok=True,
                    staged=True,
                    at_ns=time.time_ns(),
                )
                await bus.publish(subjects.allocated(node), result)

        start = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for p in pods:
                pod = _pending_pod(p, uids[p])
                pod["metadata"]["annotations"] = {NODE_SCHEDULER_POLICY: "spread"}
                result = (await _post_filter(client, pod, names)).json()
                if not result["NodeNames"]:
                    raise SystemExit(f"filter failed: {result['Error'] or result['FailedNodes']}")
                await slots.acquire()  # at most 32 binds in flight, like a busy scheduler
                slots.release()
                tg.create_task(bind(p, result["NodeNames"][0]))
        return len(pods) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="one resident pod per node instead of 10, and fewer requests"
    )
    parser.add_argument(
        "--httpx", action="store_true", help="play kube-scheduler with httpx instead of the lean Go-like client"
    )
    parser.add_argument(
        "--mig", action="store_true", help="also run with every tenth node in MIG mode and report both side by side"
    )
    parser.add_argument(
        "--vendors",
        action="store_true",
        help="also run with Ascend, Cambricon and Hygon enabled and on every tenth node; report both side by side",
    )
    parser.add_argument("--nodes", type=int, default=5000, help="cluster size (the figures' keys name it)")
    args = parser.parse_args(argv)
    nodes = args.nodes
    resident, filters, binds = (1, 60, 60) if args.quick else (RESIDENT_PER_NODE, 400, 400)
    log_dir = Path(tempfile.mkdtemp(prefix="extender-bench-"))
    with EmbeddedNats() as nats:
        figures = run_loop(_run(nodes, resident, filters, binds, nats, log_dir, args.httpx))
        if args.mig:
            mig = run_loop(_run(nodes, resident, filters, binds, nats, log_dir, args.httpx, MIG_EVERY))
            figures.update({f"{k}_mig": v for k, v in mig.items() if k not in ("nodes", "resident_per_node")})
            for key in [k for k in mig if k.startswith(("filter_p50_ms_", "filter_p99_ms_"))]:
                stat, size = key.split("_ms_")
                figures[f"{stat}_mig_ratio_{size}"] = mig[key] / figures[key]
        if args.vendors:
            mixed = run_loop(_run(nodes, resident, filters, binds, nats, log_dir, args.httpx, 0, VENDOR_EVERY))
            figures.update({f"{k}_vendors": v for k, v in mixed.items() if k not in ("nodes", "resident_per_node")})
            for key in [k for k in mixed if k.startswith(("filter_p50_ms_", "filter_p99_ms_"))]:
                stat, size = key.split("_ms_")
                figures[f"{stat}_vendors_ratio_{size}"] = mixed[key] / figures[key]
    for key, value in figures.items():
        print(f"{key:46s} {value:10.3f}", flush=True)
    print(f"(extender logs in {log_dir})")
    summary: dict[str, float | bool | str] = {
        k: round(v, 3) for k, v in figures.items() if k.startswith(("filter_", "handler_", "binds"))
    }
    summary["resident_per_node"] = resident
    summary["quick"] = bool(args.quick)
    summary["client"] = "httpx" if args.httpx else "lean"
    if args.mig:
        summary["mig_nodes_percent"] = 100 // MIG_EVERY
    if args.vendors:
        summary["vendor_nodes_percent"] = 100 // VENDOR_EVERY
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
