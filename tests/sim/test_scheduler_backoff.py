"""The scheduler stand-in backs off a pod that fails, as kube-scheduler does (issues 18.5, 21.3).

Counts, not clocks: how many filters and Events a failing pod costs, never how long anything took.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hami_common.kube import KubeClient
from hami_sim.scheduler import FAILED_SCHEDULING, INITIAL_BACKOFF_S, MAX_BACKOFF_S, SchedulerDriver
from hami_sim.waiting import eventually
from tests.sim.test_scheduler_driver import ToyExtender, create_node, create_pod, serve


async def start(
    kube: KubeClient, extender: ToyExtender, retry_after: float, max_backoff: float
) -> tuple[SchedulerDriver, Any]:
    url, server, thread = serve(extender.app)
    driver = SchedulerDriver(kube, url, retry_after=retry_after, max_backoff=max_backoff)
    task = asyncio.create_task(driver.run())

    async def stop() -> None:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        server.should_exit = True
        await asyncio.to_thread(thread.join, 10)

    return driver, stop


def failed_scheduling(core: Any, name: str) -> list[Any]:
    events = core.list_namespaced_event("default", field_selector=f"involvedObject.name={name}").items
    return [e for e in events if e.reason == FAILED_SCHEDULING]


def test_backoff_doubles_from_one_second_to_ten_as_kube_scheduler() -> None:
    driver = SchedulerDriver.__new__(SchedulerDriver)
    driver.retry_after, driver.max_backoff = INITIAL_BACKOFF_S, MAX_BACKOFF_S
    assert [driver.backoff_of(n) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


@pytest.fixture
async def failing(core: Any, kube: KubeClient) -> AsyncIterator[tuple[ToyExtender, SchedulerDriver]]:
    extender = ToyExtender(core, errors=10**6)  # every filter fails, as for a pod asking nvidia.com/gpumem: lots
    driver, stop = await start(kube, extender, retry_after=0.01, max_backoff=0.04)
    yield extender, driver
    await stop()


async def test_an_extender_error_is_one_counted_failed_scheduling_event_on_the_pod(
    core: Any, failing: tuple[ToyExtender, SchedulerDriver]
) -> None:
    extender, _ = failing
    create_node(core, "gpu-1")
    create_pod(core, "doomed")

    def errors() -> list[Any]:
        return [e for e in failed_scheduling(core, "doomed") if e.message == "cache not synced"]

    await eventually(lambda: extender.filters >= 6, timeout=20)
    await eventually(lambda: bool(errors()) and errors()[0].count >= 5)
    (event,) = errors()  # one object, counted, not one per attempt
    assert event.type == "Warning"


async def test_updates_of_a_pod_in_backoff_do_not_cut_the_backoff_short(core: Any, kube: KubeClient) -> None:
    extender = ToyExtender(core, errors=10**6)
    driver, stop = await start(kube, extender, retry_after=600.0, max_backoff=600.0)
    try:
        create_node(core, "gpu-1")
        create_pod(core, "doomed")
        await eventually(lambda: extender.filters == 1 and driver.attempts, timeout=10)
        for i in range(5):  # each update is a watch event that used to put the pod straight back in the queue
            core.patch_namespaced_pod("doomed", "default", {"metadata": {"labels": {"touch": str(i)}}})

        def seen_last_update() -> bool:
            pod = driver._pods.get("default", "doomed")
            return pod is not None and pod.metadata.labels.get("touch") == "4"

        await eventually(seen_last_update)
        await asyncio.sleep(0)  # let the handler of the last update run
        assert extender.filters == 1
    finally:
        await stop()


async def test_a_pod_that_is_bound_forgets_its_failures(core: Any, kube: KubeClient) -> None:
    extender = ToyExtender(core, errors=3)
    driver, stop = await start(kube, extender, retry_after=0.01, max_backoff=0.02)
    try:
        create_node(core, "gpu-1")
        create_pod(core, "patient")
        await eventually(lambda: core.read_namespaced_pod("patient", "default").spec.node_name == "gpu-1", timeout=10)
        await eventually(lambda: not driver.attempts)
    finally:
        await stop()
