"""Fixtures of the extender tests: the Kubernetes API emulator, NATS, and the extender served by uvicorn."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from hami_common.bus import EmbeddedNats
from hami_extender.app import create_app
from hami_extender.settings import ExtenderSettings
from hami_sim.kubeapi import KubeApiEmulator
from tests.extender.cluster import ensure_namespace


@pytest.fixture
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator(bookmark_interval=0.2) as api:
        ensure_namespace(api, "default")
        yield api


@pytest.fixture
def settings(emulator: KubeApiEmulator, nats_server: EmbeddedNats, tmp_path: Path) -> ExtenderSettings:
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    return ExtenderSettings(
        kubeconfig=str(kubeconfig),
        kube_timeout=5.0,
        nats_url=nats_server.url,
        handoff_wait=5.0,
        sync_wait=5.0,
        identity="extender-test",
        service_name="extender-test",
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Served:
    """A running extender: its base URL, an HTTP client, and the app (for its state in assertions)."""

    def __init__(self, url: str, client: httpx.AsyncClient, server: uvicorn.Server) -> None:
        self.url = url
        self.client = client
        self.server = server

    @property
    def state(self) -> Any:
        return self.server.lifespan.state

    async def filter(self, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
        response = await self.client.post("/filter", json={"Pod": pod, "Nodes": None, "NodeNames": nodes})
        assert response.status_code == 200
        result: dict[str, Any] = response.json()
        return result

    async def bind(self, pod: dict[str, Any], node: str) -> dict[str, Any]:
        meta = pod["metadata"]
        body = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
        response = await self.client.post("/bind", json=body)
        assert response.status_code == 200
        result: dict[str, Any] = response.json()
        return result


@asynccontextmanager
async def serve(settings: ExtenderSettings) -> AsyncIterator[Served]:
    """Serve an extender with these settings over real HTTP until the block ends."""
    port = free_port()
    app = create_app(dataclasses.replace(settings, http_port=port))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)  # uvicorn has no started event to await
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=url, timeout=10.0) as client:
        await client.get("/readyz")
        try:
            yield Served(url, client, server)
        finally:
            server.should_exit = True
            await task


@pytest.fixture
async def extender(settings: ExtenderSettings) -> AsyncIterator[Served]:
    async with serve(settings) as served:
        yield served
