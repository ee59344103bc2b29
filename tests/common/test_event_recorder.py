"""Events as client-go records them (issue 18.5): counted, folded and rate-limited, not one object per call.

Run against the API emulator; ``tests/realk8s/test_events_aggregated.py`` runs the same recorder against the
real kube-apiserver.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from hami_common.kube import EventRecorder, KubeClient, KubeSettings, Pod, reference_to
from hami_common.kube._events import AGGREGATE_MAX_EVENTS, COMBINED_PREFIX, SPAM_BURST
from hami_sim.kubeapi import KubeApiEmulator


class Clock:
    """Time that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def __call__(self) -> dt.datetime:
        return self.now


@pytest.fixture
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator(bookmark_interval=0.2) as api:
        yield api


@pytest.fixture
def core(emulator: KubeApiEmulator, tmp_path: Path) -> Iterator[Any]:
    with config.new_client_from_config(str(emulator.write_kubeconfig(tmp_path / "kc"))) as api:  # type: ignore[no-untyped-call]
        yield client.CoreV1Api(api)


@pytest.fixture
async def kube(emulator: KubeApiEmulator, tmp_path: Path) -> AsyncIterator[KubeClient]:
    settings = KubeSettings(kubeconfig=str(emulator.write_kubeconfig(tmp_path / "kc2")), kube_timeout=5.0)
    async with KubeClient.from_settings(settings) as connected:
        yield connected


async def a_pod(kube: KubeClient, core: Any, name: str = "pending") -> Pod:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "cuda"}]},
    }
    core.create_namespaced_pod("default", body)
    return await kube.get_pod("default", name)


def events_of(core: Any, name: str) -> list[Any]:
    selector = f"involvedObject.name={name},involvedObject.kind=Pod"
    return list(core.list_namespaced_event("default", field_selector=selector).items)


async def test_a_repeated_event_is_one_object_whose_count_grows(kube: KubeClient, core: Any) -> None:
    clock = Clock()
    recorder = EventRecorder(kube, component="hami-scheduler", clock=clock)
    ref = reference_to(await a_pod(kube, core), "Pod")
    for _ in range(20):
        clock.now += dt.timedelta(seconds=3)
        assert await recorder.record(ref, "Warning", "FailedScheduling", "0/4 nodes are available")
    events = events_of(core, "pending")
    assert len(events) == 1
    assert events[0].count == 20
    assert events[0].first_timestamp < events[0].last_timestamp
    assert (recorder.created, recorder.patched) == (1, 19)


async def test_similar_events_with_different_messages_fold_into_one_combined_event(kube: KubeClient, core: Any) -> None:
    clock = Clock()
    recorder = EventRecorder(kube, component="hami-scheduler", clock=clock)
    ref = reference_to(await a_pod(kube, core), "Pod")
    for i in range(15):
        clock.now += dt.timedelta(seconds=1)
        await recorder.record(ref, "Warning", "FilteringFailed", f"no available node, attempt {i}")
    events = events_of(core, "pending")
    assert len(events) == AGGREGATE_MAX_EVENTS  # 9 distinct ones, then one combined event for the rest
    combined = [e for e in events if e.message.startswith(COMBINED_PREFIX)]
    assert len(combined) == 1
    assert combined[0].count == 15 - (AGGREGATE_MAX_EVENTS - 1)
    assert combined[0].message == COMBINED_PREFIX + "no available node, attempt 14"


async def test_events_about_one_object_are_rate_limited_and_the_budget_refills(kube: KubeClient, core: Any) -> None:
    clock = Clock()
    recorder = EventRecorder(kube, component="hami-scheduler", clock=clock)
    ref = reference_to(await a_pod(kube, core), "Pod")
    taken = [await recorder.record(ref, "Warning", "FailedScheduling", "same") for _ in range(SPAM_BURST + 10)]
    assert taken.count(True) == SPAM_BURST
    assert recorder.dropped == 10
    assert events_of(core, "pending")[0].count == SPAM_BURST
    clock.now += dt.timedelta(minutes=5)  # one token per 5 minutes
    assert await recorder.record(ref, "Warning", "FailedScheduling", "same")
    assert not await recorder.record(ref, "Warning", "FailedScheduling", "same")
    other = reference_to(await a_pod(kube, core, "other"), "Pod")
    assert await recorder.record(other, "Warning", "FailedScheduling", "same"), "the budget is per object"


async def test_an_event_deleted_meanwhile_is_written_again(kube: KubeClient, core: Any) -> None:
    recorder = EventRecorder(kube, component="hami-scheduler", clock=Clock())
    ref = reference_to(await a_pod(kube, core), "Pod")
    assert await recorder.record(ref, "Normal", "BindingSucceed", "bound")
    core.delete_namespaced_event(events_of(core, "pending")[0].metadata.name, "default")
    assert await recorder.record(ref, "Normal", "BindingSucceed", "bound")
    assert [e.count for e in events_of(core, "pending")] == [1]
