"""Scrape time of the metrics aggregator at cluster scale, while usage samples keep arriving.

One process runs an embedded nats-server, the aggregator app under uvicorn (real HTTP on loopback) and a
publisher. The publisher seeds N nodes x G GPUs x C containers per GPU (one pod per container): an
inventory per node, a device sample per GPU, a placement and a usage report per container. Then it keeps
publishing usage reports (every container once per ``--period`` seconds) while /metrics is scraped
``--scrapes`` times by a separate scraper process (with gzip, as Prometheus asks, and a minimal HTTP client
timed to the last byte), then once without compression. The aggregator subscribes on the publisher's
connection, so seeding is awaited exactly (no lost messages before its subscriptions exist).

Also measured, in-process on the same state: building the families plus rendering them with the service's
own text renderer, and with prometheus_client's ``generate_latest`` over an equivalent Collector.

    python benchmarks/metrics_scrape.py [--quick] [--nodes 1000] [--gpus 8] [--containers 4] [--shards 1]

With ``--shards N`` the nodes are split over N aggregators (one process here; in a cluster, N pods) and
``scrape_ms`` is the median over every shard's scrapes, ``series`` the sum.

The last line is JSON with ``scrape_ms`` (median over the scrapes, with ``Accept-Encoding: gzip`` as Prometheus
sends it, timed to the last byte) and ``series``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import uvicorn
from prometheus_client import CollectorRegistry, generate_latest

from hami_common import subjects
from hami_common.annotations import DeviceInfo
from hami_common.bus import Bus, EmbeddedNats
from hami_common.events import (
    ContainerPlacement,
    DeviceSample,
    NodeInventory,
    PlacedDevice,
    PlacementDecision,
    UsageSample,
)
from hami_common.settings import BusSettings
from hami_metrics.aggregator import Aggregator, Shard
from hami_metrics.app import create_app
from hami_metrics.collector import FamilyCollector
from hami_metrics.exposition import BuildInfo, Scrape, collect
from hami_metrics.settings import MetricsSettings
from hami_metrics.textformat import TextRenderer
from hami_sim.net import listening_socket

MIB = 1 << 20
SEED_BATCH = 2000


@dataclass(frozen=True)
class Shape:
    nodes: int
    gpus: int
    containers: int

    def node(self, n: int) -> str:
        return f"gpu-node-{n:05d}"

    def gpu(self, n: int, g: int) -> str:
        return f"GPU-{n:08x}-{g:04x}-4000-8000-000000000000"

    def pods(self) -> Iterator[tuple[str, str, str]]:
        """(node, gpu uuid, pod uid) for every container."""
        for n in range(self.nodes):
            for g in range(self.gpus):
                for c in range(self.containers):
                    yield self.node(n), self.gpu(n, g), f"pod-{n:05d}-{g}-{c}"


def usage(node: str, gpu: str, uid: str, now_ns: int, tick: int) -> UsageSample:
    return UsageSample(
        node=node, pod_uid=uid, namespace="bench", pod=uid, container="main", device_uuid=gpu,
        used_bytes=(1000 + tick % 1000) * MIB, limit_bytes=4000 * MIB, sm_util_percent=tick % 100,
        context_bytes=300 * MIB, module_bytes=10 * MIB, buffer_bytes=600 * MIB,
        last_kernel_at_s=now_ns // 1_000_000_000 - 1, at_ns=now_ns,
    )  # fmt: skip


async def seed(bus: Bus, aggregators: list[Aggregator], shape: Shape) -> tuple[int, float]:
    """Publish the cluster, batch by batch, each batch awaited until folded; (messages, seconds).

    Inventories go first: a shard subscribes to a node's other subjects when it folds its inventory.
    """
    start = time.perf_counter()
    now = time.time_ns()
    sent = 0
    expected = [agg.state.applied for agg in aggregators]
    batch: list[tuple[str, str, object]] = []

    async def flush() -> None:
        nonlocal sent, batch
        for node, subject, event in batch:
            await bus.publish(subject, event)  # type: ignore[arg-type]
            expected[next(i for i, agg in enumerate(aggregators) if agg.shard.owns(node))] += 1
        sent += len(batch)
        batch = []
        waits = (agg.wait_applied(n) for agg, n in zip(aggregators, expected, strict=True))
        await asyncio.wait_for(asyncio.gather(*waits), 120)

    for n in range(shape.nodes):
        node = shape.node(n)
        devices = tuple(
            DeviceInfo(
                id=shape.gpu(n, g), index=g, count=10, devmem=81920, devcore=100, type="NVIDIA-A100", health=True
            )
            for g in range(shape.gpus)
        )
        batch.append((node, subjects.inventory(node), NodeInventory(node=node, devices=devices, at_ns=now)))
    await flush()
    for n in range(shape.nodes):
        node = shape.node(n)
        for g in range(shape.gpus):
            sample = DeviceSample(node=node, device_uuid=shape.gpu(n, g), index=g, name="A100-SXM4-80GB",
                                  memory_used_bytes=16000 * MIB, utilization_percent=60, at_ns=now)  # fmt: skip
            batch.append((node, subjects.usage(node), sample))
    await flush()
    for node, gpu, uid in shape.pods():
        placed = ContainerPlacement(
            name="main", devices=(PlacedDevice(uuid=gpu, type="NVIDIA", usedmem_mib=4000, usedcores=25),)
        )
        decision = PlacementDecision(
            pod_uid=uid, namespace="bench", name=uid, node=node, containers=(placed,), bind_time_ns=now
        )
        batch.append((node, subjects.placement(node), decision))
        batch.append((node, subjects.usage(node), usage(node, gpu, uid, now, 0)))
        if len(batch) >= SEED_BATCH:
            await flush()
    await flush()
    return sent, time.perf_counter() - start


async def keep_publishing(bus: Bus, shape: Shape, period_s: float, counter: list[int]) -> None:
    """Every container once per ``period_s``, in 20 slices a period, until cancelled."""
    pods = list(shape.pods())
    slices = 20
    per_slice = max(len(pods) // slices, 1)
    tick = 0
    while True:
        for first in range(0, len(pods), per_slice):
            started = time.perf_counter()
            now = time.time_ns()
            tick += 1
            for node, gpu, uid in pods[first : first + per_slice]:
                await bus.publish(subjects.usage(node), usage(node, gpu, uid, now, tick))
            counter[0] += len(pods[first : first + per_slice])
            # pacing of a load generator, not a test wait
            await asyncio.sleep(max(period_s / slices - (time.perf_counter() - started), 0))


async def raw_get(host: str, port: int, path: str, encoding: str = "identity") -> tuple[float, bytes, int]:
    """One GET on a fresh connection, timed to the last byte, with as little client work as possible
    (Prometheus, in Go, spends little on reading; a Python HTTP client would dominate the figure).
    Returns (milliseconds, body, number of body bytes on the wire)."""
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept-Encoding: {encoding}\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        assert status == b"200", head
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        body = await reader.readexactly(length)
        return (time.perf_counter() - start) * 1000, body, length
    finally:
        writer.close()
        await writer.wait_closed()


@contextlib.asynccontextmanager
async def serving(bus: Bus, settings: MetricsSettings, aggregator: Aggregator) -> AsyncIterator[tuple[str, int]]:
    sock = listening_socket()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings, aggregator=aggregator, bus=bus), log_config=None, access_log=False)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield "127.0.0.1", int(sock.getsockname()[1])
    finally:
        server.should_exit = True
        await task
        sock.close()


async def run(shape: Shape, scrapes: int, period_s: float, compare: bool, shards: int) -> dict[str, object]:
    with EmbeddedNats() as nats:
        aggregators: list[Aggregator] = []
        async with (
            await Bus.connect(BusSettings(nats_url=nats.url, service_name="bench")) as bus,
            contextlib.AsyncExitStack() as stack,
        ):
            targets: list[str] = []
            for index in range(shards):
                settings = MetricsSettings(
                    nats_url=nats.url, node_staleness_s=3600, usage_staleness_s=3600,
                    shard_index=index, shard_count=shards,
                )  # fmt: skip
                aggregator = Aggregator(settings.retention(), shard=Shard(index, shards))
                host, port = await stack.enter_async_context(serving(bus, settings, aggregator))
                async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=60) as client:
                    assert (await client.get("/healthz")).status_code == 200  # waits for the lifespan
                aggregators.append(aggregator)
                targets.append(f"{host}:{port}")
            sent, seed_s = await seed(bus, aggregators, shape)
            print(f"seeded {sent} messages in {seed_s:.1f}s ({sent / seed_s:.0f}/s folded)")
            for target in targets:
                target_host, target_port = target.rsplit(":", 1)
                await raw_get(target_host, int(target_port), "/metrics")  # the first scrape fills the caches

            counter = [0]
            applied_before = sum(agg.state.applied for agg in aggregators)
            publisher = asyncio.create_task(keep_publishing(bus, shape, period_s, counter))
            began = time.perf_counter()
            # The scraper is another process, as Prometheus is: this one only serves, folds and publishes.
            scraper = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--scrape", ",".join(targets), "--scrapes", str(scrapes),
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, _ = await scraper.communicate()
            measured = json.loads(out.decode().strip().splitlines()[-1])
            times, per_target = measured["times"], measured["series"]
            series, body_bytes = sum(per_target), measured["body_bytes"]
            plain_ms, gzip_bytes = measured["plain_ms"], measured["gzip_bytes"]
            elapsed = time.perf_counter() - began
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher
            folded = sum(agg.state.applied for agg in aggregators) - applied_before

        state = aggregators[0].snapshot()
        scrape = Scrape(now_ns=time.time_ns(), build=BuildInfo(version="bench"))
        t0 = time.perf_counter()
        families = collect(state, scrape)
        collect_ms = (time.perf_counter() - t0) * 1000
        renderer = TextRenderer()
        renderer.render(families)
        t0 = time.perf_counter()
        renderer.render(collect(state, scrape))
        render_ms = (time.perf_counter() - t0) * 1000
        client_ms = None
        if compare:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(FamilyCollector(lambda: collect(state, scrape)))
            t0 = time.perf_counter()
            generate_latest(registry)
            client_ms = (time.perf_counter() - t0) * 1000

    print(
        f"cluster: {shape.nodes} nodes x {shape.gpus} GPUs x {shape.containers} containers per GPU, {shards} shard(s)"
    )
    print(f"scrapes over HTTP with gzip, as Prometheus asks (ms): {', '.join(f'{t:.0f}' for t in times)}")
    print(f"one scrape without compression: {plain_ms:.0f} ms")
    print(f"series {series} ({', '.join(map(str, per_target))} per shard), body {body_bytes / 1e6:.1f} MB "
          f"({gzip_bytes / 1e6:.1f} MB gzip)")  # fmt: skip
    print(f"usage reports published during the scrapes: {counter[0]} ({counter[0] / elapsed:.0f}/s), folded {folded}")
    print(f"in-process, shard 0: collect {collect_ms:.0f} ms, collect+render (warm cache) {render_ms:.0f} ms", end="")
    load = os.getloadavg()[0]
    print(f", prometheus_client {client_ms:.0f} ms" if client_ms is not None else "")
    return {
        "scrape_ms": round(statistics.median(times), 1),
        "scrape_ms_max": round(max(times), 1),
        "plain_scrape_ms": round(plain_ms, 1),
        "series": series,
        "shards": shards,
        "series_per_shard": per_target,
        "body_mb": round(body_bytes / 1e6, 1),
        "gzip_mb": round(gzip_bytes / 1e6, 2),
        "collect_ms": round(collect_ms, 1),
        "render_ms": round(render_ms, 1),
        "prometheus_client_ms": None if client_ms is None else round(client_ms, 1),
        "usage_per_s_during_scrapes": round(counter[0] / elapsed),
        "nodes": shape.nodes,
        "gpus_per_node": shape.gpus,
        "containers_per_gpu": shape.containers,
        "load_avg_1m": round(load, 2),  # this host's load when done: the figures are wall-clock times
    }


async def scrape_only(targets: str, scrapes: int) -> dict[str, object]:
    """The scraper process: for each target (shard) in turn, ``scrapes`` GETs as Prometheus sends them
    (gzip), then one uncompressed GET per target. Sizes are summed over targets."""
    addresses = [(host, int(port)) for host, port in (t.rsplit(":", 1) for t in targets.split(","))]
    times: list[float] = []
    gzip_bytes = body_bytes = 0
    for _ in range(scrapes):
        for host, port in addresses:
            ms, _, _ = await raw_get(host, port, "/metrics", encoding="gzip")
            times.append(ms)
    series: list[int] = []
    plain_ms = 0.0
    for host, port in addresses:
        _, _, size = await raw_get(host, port, "/metrics", encoding="gzip")
        gzip_bytes += size
        ms, body, size = await raw_get(host, port, "/metrics")
        plain_ms, body_bytes = max(plain_ms, ms), body_bytes + size
        series.append(sum(1 for line in body.split(b"\n") if line and not line.startswith(b"#")))
    return {"times": times, "series": series, "body_bytes": body_bytes, "plain_ms": plain_ms, "gzip_bytes": gzip_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--scrape", metavar="HOST:PORT", help=argparse.SUPPRESS)  # the scraper process
    parser.add_argument("--quick", action="store_true", help="100 nodes, 3 scrapes")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--containers", type=int, default=4, help="containers (pods) per GPU")
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--period", type=float, default=10.0, help="seconds between two reports of a container")
    parser.add_argument("--no-compare", action="store_true", help="skip the prometheus_client comparison")
    parser.add_argument("--shards", type=int, default=1, help="aggregators splitting the nodes by node-name hash")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.scrape:
        print(json.dumps(asyncio.run(scrape_only(args.scrape, args.scrapes))))
        return
    nodes, scrapes = (100, 3) if args.quick else (args.nodes, args.scrapes)
    shape = Shape(nodes=nodes, gpus=args.gpus, containers=args.containers)
    summary = asyncio.run(run(shape, scrapes, args.period, compare=not args.no_compare, shards=args.shards))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
