"""Fixtures of the metrics tests: a clock the test moves, the aggregator served over real HTTP on a real
bus, events built with sensible defaults, and a parser that turns a scrape into a {(name, labels): value}."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from hami_common.annotations import DeviceInfo
from hami_common.bus import Bus, EmbeddedNats
from hami_common.events import ContainerPlacement, NodeInventory, PlacedDevice, PlacementDecision, UsageSample
from hami_metrics.aggregator import Aggregator, Shard
from hami_metrics.app import create_app
from hami_metrics.settings import MetricsSettings
from hami_metrics.state import NS_PER_S
from hami_sim.net import listening_socket

START_NS = 1_800_000_000 * NS_PER_S
PROMTOOL_INSTALL_TIMEOUT_S = 240


class FakeClock:
    def __init__(self, now_ns: int = START_NS) -> None:
        self.now = now_ns

    def now_ns(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * NS_PER_S)


Labels = frozenset[tuple[str, str]]
Samples = dict[tuple[str, Labels], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape, keyed by sample name and its full label set."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def series(samples: Samples, name: str) -> dict[Labels, float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def labels(**kv: str) -> Labels:
    return frozenset(kv.items())


@dataclass
class Served:
    client: httpx.AsyncClient
    aggregator: Aggregator
    clock: FakeClock
    bus: Bus

    async def scrape(self, **headers: str) -> Samples:
        response = await self.client.get("/metrics", headers=headers)
        assert response.status_code == 200, response.text
        return parse(response.text)

    async def publish(self, subject: str, *events: object) -> None:
        """Publish on the aggregator's own connection (so after its subscriptions) and wait until folded."""
        target = self.aggregator.state.applied + len(events)
        for event in events:
            await self.bus.publish(subject, event)  # type: ignore[arg-type]
        await asyncio.wait_for(self.aggregator.wait_applied(target), 10)


def free_socket() -> socket.socket:
    return listening_socket()


@contextlib.asynccontextmanager
async def serve(
    settings: MetricsSettings, bus: Bus, clock: FakeClock, *, scheme: str = "http", verify: ssl.SSLContext | bool = True
) -> AsyncIterator[Served]:
    aggregator = Aggregator(settings.retention(), clock=clock, shard=Shard(settings.shard_index, settings.shard_count))
    app = create_app(settings, aggregator=aggregator, bus=bus)
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="on",
        ssl_certfile=settings.tls_cert_file or None,
        ssl_keyfile=settings.tls_key_file or None,
    )
    server = uvicorn.Server(config)
    sock = free_socket()
    port = sock.getsockname()[1]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with httpx.AsyncClient(base_url=f"{scheme}://127.0.0.1:{port}", verify=verify, timeout=10) as client:
            # The listening socket queues this request until the lifespan has subscribed and uvicorn serves.
            assert (await client.get("/healthz")).status_code == 200
            yield Served(client=client, aggregator=aggregator, clock=clock, bus=bus)
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def settings(nats_server: EmbeddedNats) -> MetricsSettings:
    return MetricsSettings(nats_url=nats_server.url, node_staleness_s=90, usage_staleness_s=30)


@pytest.fixture
async def served(settings: MetricsSettings, bus: Bus, clock: FakeClock) -> AsyncIterator[Served]:
    async with serve(settings, bus, clock) as running:
        yield running


# --- events with defaults -------------------------------------------------------------------------------
NODE = "gpu-1.example"
GPU_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
GPU_B = "GPU-bbbbbbbb-1111-2222-3333-444444444444"


def inventory(
    node: str = NODE, *, at_ns: int = START_NS, devices: tuple[DeviceInfo, ...] | None = None
) -> NodeInventory:
    if devices is None:
        devices = (
            DeviceInfo(id=GPU_A, index=0, count=10, devmem=81920, devcore=100, type="NVIDIA-A100", health=True),
            DeviceInfo(id=GPU_B, index=1, count=10, devmem=81920, devcore=100, type="NVIDIA-A100", health=True),
        )
    return NodeInventory(node=node, devices=devices, at_ns=at_ns)


def placement(
    uid: str, *containers: ContainerPlacement, node: str = NODE, namespace: str = "team-a", bind_ns: int = START_NS
) -> PlacementDecision:
    return PlacementDecision(
        pod_uid=uid, namespace=namespace, name=f"pod-{uid}", node=node, containers=containers, bind_time_ns=bind_ns
    )


def container(name: str, *devices: tuple[str, int, int], init: bool = False) -> ContainerPlacement:
    return ContainerPlacement(
        name=name,
        init=init,
        devices=tuple(PlacedDevice(uuid=u, type="NVIDIA", usedmem_mib=m, usedcores=c) for u, m, c in devices),
    )


def usage(uid: str, device: str = GPU_A, *, node: str = NODE, ctr: str = "main", used: int = 1 << 30,
          at_ns: int = START_NS, **extra: int) -> UsageSample:  # fmt: skip
    return UsageSample(
        node=node, pod_uid=uid, namespace="team-a", pod=f"pod-{uid}", container=ctr, device_uuid=device,
        used_bytes=used, limit_bytes=4 << 30, sm_util_percent=30, at_ns=at_ns, **extra,
    )  # fmt: skip


# --- promtool -------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def promtool() -> str:
    """``promtool`` from PATH, else from Debian's prometheus package installed once (as root only)."""
    found = shutil.which("promtool")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        try:
            subprocess.run(
                ["apt-get", "install", "-y", "--no-install-recommends", "prometheus"],
                check=False, capture_output=True, timeout=PROMTOOL_INSTALL_TIMEOUT_S, env=env,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.skip(f"installing Debian's prometheus package took over {PROMTOOL_INSTALL_TIMEOUT_S}s")
        found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not on PATH and Debian's prometheus package could not be installed (needs root)")
    return found
