"""The kube-scheduler stand-in honours the extender's ``managedResources`` as kube-scheduler does.

The extender is asked only about pods that name a managed resource; every pod is first checked against the
nodes' allocatable (NodeResourcesFit), except for resources managed with ``ignoredByScheduler: true``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hami_common.kube import KubeClient
from hami_sim.realk8s import ManagedResource, deployed, managed_resources
from hami_sim.scheduler import FAILED_SCHEDULING, SchedulerDriver
from hami_sim.waiting import eventually
from tests.sim.test_scheduler_driver import OURS, ToyExtender, node_of, serve

COUNTED = "example.com/slice"  # managed, and counted against allocatable too (ignoredByScheduler: false)
MEMORY = "example.com/slicemem"  # managed, the extender's alone (ignoredByScheduler: true)
OTHER = "other.com/chip"  # no extender manages it: kube-scheduler's own business
MANAGED = (ManagedResource(COUNTED), ManagedResource(MEMORY, ignored_by_scheduler=True))


def make_node(core: Any, name: str, allocatable: dict[str, str]) -> None:
    status = {"capacity": allocatable, "allocatable": allocatable}
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": status})


def make_pod(core: Any, name: str, limits: dict[str, str], *, init: dict[str, str] | None = None) -> None:
    spec: dict[str, Any] = {
        "schedulerName": OURS,
        "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}],
    }
    if init is not None:
        spec["initContainers"] = [{"name": "setup", "image": "cuda", "resources": {"limits": init}}]
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def failures_of(core: Any, pod: str) -> list[str]:
    """The pod's FailedScheduling messages that name nodes (not "no nodes available" while the node watch
    has not seen the node yet)."""
    events = core.list_namespaced_event("default").items
    return [
        e.message
        for e in events
        if e.reason == FAILED_SCHEDULING and e.involved_object.name == pod and e.message.startswith("0/")
    ]


@pytest.fixture
async def managed(core: Any, kube: KubeClient) -> AsyncIterator[ToyExtender]:
    extender = ToyExtender(core)
    url, server, thread = serve(extender.app)
    driver = SchedulerDriver(kube, url, retry_after=0.1, managed=MANAGED)
    task = asyncio.create_task(driver.run())
    yield extender
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    server.should_exit = True
    await asyncio.to_thread(thread.join, 10)


async def test_a_pod_naming_no_managed_resource_is_bound_without_asking_the_extender(
    core: Any, managed: ToyExtender
) -> None:
    make_node(core, "small", {"cpu": "1", "pods": "10"})
    make_node(core, "big", {"cpu": "8", "pods": "10"})
    make_pod(core, "plain", {"cpu": "4"})
    await eventually(lambda: node_of(core, "plain") == "big", timeout=10)
    assert managed.filtered == []


async def test_a_pod_naming_a_managed_resource_goes_to_the_extender_with_the_nodes_that_fit(
    core: Any, managed: ToyExtender
) -> None:
    make_node(core, "gpu-1", {COUNTED: "4", "pods": "10"})
    make_node(core, "bare", {"pods": "10"})
    make_pod(core, "asks", {MEMORY: "1000"}, init={COUNTED: "1"})  # named by an init container only
    await eventually(lambda: node_of(core, "asks") == "gpu-1", timeout=10)
    assert managed.filtered == ["asks"]


async def test_a_counted_resource_beyond_every_node_is_insufficient_and_never_reaches_the_extender(
    core: Any, managed: ToyExtender
) -> None:
    make_node(core, "gpu-1", {COUNTED: "2", "pods": "10"})
    make_pod(core, "greedy", {COUNTED: "3"})
    await eventually(lambda: bool(failures_of(core, "greedy")), timeout=10)
    assert failures_of(core, "greedy")[0] == f"0/1 nodes are available: gpu-1: Insufficient {COUNTED}."
    assert managed.filtered == []
    assert node_of(core, "greedy") == ""


async def test_what_bound_pods_hold_counts_against_allocatable(core: Any, managed: ToyExtender) -> None:
    make_node(core, "gpu-1", {COUNTED: "2", "pods": "10"})
    make_pod(core, "first", {COUNTED: "2"})
    await eventually(lambda: node_of(core, "first") == "gpu-1", timeout=10)
    make_pod(core, "second", {COUNTED: "1"})
    await eventually(lambda: bool(failures_of(core, "second")), timeout=10)
    assert f"Insufficient {COUNTED}" in failures_of(core, "second")[0]
    assert managed.filtered == ["first"]


async def test_an_ignored_managed_resource_is_left_to_the_extender(core: Any, managed: ToyExtender) -> None:
    make_node(core, "gpu-1", {COUNTED: "1", "pods": "10"})  # no MEMORY in allocatable at all
    make_pod(core, "memory", {COUNTED: "1", MEMORY: "40000"})
    await eventually(lambda: node_of(core, "memory") == "gpu-1", timeout=10)
    assert managed.filtered == ["memory"]


async def test_an_unmanaged_extended_resource_no_node_has_is_insufficient(core: Any, managed: ToyExtender) -> None:
    make_node(core, "gpu-1", {COUNTED: "8", "pods": "10"})
    make_pod(core, "vendor", {OTHER: "1"})
    await eventually(lambda: bool(failures_of(core, "vendor")), timeout=10)
    assert failures_of(core, "vendor")[0] == f"0/1 nodes are available: gpu-1: Insufficient {OTHER}."
    assert managed.filtered == []


def test_the_deployed_scheduler_configuration_counts_whole_gpus_and_leaves_memory_to_the_extender() -> None:
    """What the emulated stack's stand-in reads: deploy/'s KubeSchedulerConfiguration, rendered by kubectl."""
    rendered = {r.name: r.ignored_by_scheduler for r in managed_resources(deployed())}
    assert rendered["nvidia.com/gpu"] is False
    assert rendered["nvidia.com/gpumem"] is True
