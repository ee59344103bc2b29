"""The kube-scheduler stand-in against the API emulator and a small extender over real HTTP."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from kubernetes import client

from hami_common.kube import KubeClient
from hami_sim.net import listening_socket
from hami_sim.scheduler import SchedulerDriver
from hami_sim.waiting import eventually

OURS = "hami-scheduler"


class ToyExtender:
    """Fits a pod on any node not named ``full``; fails the first ``errors`` filters; binds via the API."""

    def __init__(self, core: Any, errors: int = 0) -> None:
        self.core = core
        self.errors = errors
        self.filters = 0
        self.filtered: list[str] = []  # pod names, one per filter call
        self.app = FastAPI()
        self.app.post("/filter")(self.filter)
        self.app.post("/bind")(self.bind)

    async def filter(self, request: Request) -> Response:
        args = msgspec.json.decode(await request.body())
        self.filters += 1
        self.filtered.append(args["Pod"]["metadata"]["name"])
        if self.errors > 0:
            self.errors -= 1
            return Response(msgspec.json.encode({"Error": "cache not synced"}), media_type="application/json")
        fit = [n for n in args["NodeNames"] if n != "full"]
        if fit:  # as the real extender does: annotate the pod during filter, which the driver's watch sees
            patch = {"metadata": {"annotations": {"example.com/filtered": fit[0]}}}
            await asyncio.to_thread(self.core.patch_namespaced_pod, args["Pod"]["metadata"]["name"], "default", patch)
        failed = {n: "1/1 CardInsufficientMemory" for n in args["NodeNames"] if n == "full"}
        answer = {"Nodes": None, "NodeNames": fit[:1] or None, "FailedNodes": failed, "Error": ""}
        return Response(msgspec.json.encode(answer), media_type="application/json")

    async def bind(self, request: Request) -> Response:
        args = msgspec.json.decode(await request.body())
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=args["PodName"]),
            target=client.V1ObjectReference(kind="Node", name=args["Node"]),
        )
        await asyncio.to_thread(
            self.core.create_namespaced_pod_binding, args["PodName"], args["PodNamespace"], body,
            _preload_content=False,
        )  # fmt: skip
        return Response(b'{"Error":""}', media_type="application/json")


def serve(app: FastAPI) -> tuple[str, uvicorn.Server, threading.Thread]:
    sock = listening_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", server, thread


def create_pod(core: Any, name: str, scheduler: str = OURS) -> None:
    core.create_namespaced_pod(
        "default",
        {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": scheduler, "containers": [{"name": "main", "image": "cuda"}]},
        },
    )  # fmt: skip


def create_node(core: Any, name: str) -> None:
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


def node_of(core: Any, name: str) -> str:
    return str(core.read_namespaced_pod(name, "default").spec.node_name or "")


async def run_driver(driver: SchedulerDriver) -> asyncio.Task[None]:
    return asyncio.create_task(driver.run())


@pytest.fixture
async def started(core: Any, kube: KubeClient) -> AsyncIterator[tuple[ToyExtender, SchedulerDriver]]:
    extender = ToyExtender(core)
    url, server, thread = serve(extender.app)
    driver = SchedulerDriver(kube, url, retry_after=0.1)
    task = asyncio.create_task(driver.run())
    yield extender, driver
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    server.should_exit = True
    await asyncio.to_thread(thread.join, 10)


async def test_our_pods_are_bound_where_the_extender_says_and_others_are_left_alone(
    core: Any, started: tuple[ToyExtender, SchedulerDriver]
) -> None:
    create_node(core, "full")
    create_node(core, "gpu-1")
    create_pod(core, "ours")
    create_pod(core, "theirs", scheduler="default-scheduler")
    await eventually(lambda: node_of(core, "ours") == "gpu-1", timeout=10)
    assert node_of(core, "theirs") == ""


async def test_pod_that_fits_nowhere_stays_pending_with_the_reason_then_lands_when_a_node_appears(
    core: Any, started: tuple[ToyExtender, SchedulerDriver]
) -> None:
    create_node(core, "full")
    create_pod(core, "waiting")

    def failed_scheduling() -> list[str]:
        events = core.list_namespaced_event("default").items
        return [e.message for e in events if e.reason == "FailedScheduling" and e.message.startswith("0/")]

    await eventually(lambda: bool(failed_scheduling()), timeout=10)
    assert failed_scheduling()[0] == "0/1 nodes are available: full: 1/1 CardInsufficientMemory."
    assert node_of(core, "waiting") == ""
    create_node(core, "gpu-2")
    await eventually(lambda: node_of(core, "waiting") == "gpu-2", timeout=10)


async def test_extender_errors_are_retried_until_the_pod_is_bound(
    core: Any, started: tuple[ToyExtender, SchedulerDriver]
) -> None:
    extender, _ = started
    extender.errors = 3
    create_node(core, "gpu-1")
    create_pod(core, "patient")
    await eventually(lambda: node_of(core, "patient") == "gpu-1", timeout=10)
    assert extender.filters >= 4


async def test_a_pod_whose_bind_is_in_flight_is_not_filtered_again(
    core: Any, started: tuple[ToyExtender, SchedulerDriver]
) -> None:
    extender, _ = started
    create_node(core, "gpu-1")
    for i in range(5):
        create_pod(core, f"p{i}")
    await eventually(lambda: all(node_of(core, f"p{i}") == "gpu-1" for i in range(5)), timeout=10)
    assert sorted(extender.filtered) == [f"p{i}" for i in range(5)]
