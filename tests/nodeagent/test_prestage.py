"""Pre-staging: placements become staged Allocate answers, exactly once, and leave with their pods."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import pytest

from hami_common import envvars, subjects, tracing
from hami_common.allocation import NodeAllocationConfig
from hami_common.bus import Bus, Delivery, EmbeddedNats, placement_consumer, placement_stream
from hami_common.errors import InvalidInput
from hami_common.events import ContainerPlacement, PlacedDevice, PlacementDecision
from hami_common.kube import KubeClient
from hami_common.settings import BusSettings
from hami_common.staging import StagingStore
from hami_nodeagent.pods import PodIndex, node_pod_cache
from hami_nodeagent.prestage import Prestager
from hami_sim.waiting import eventually
from tests.nodeagent.conftest import NODE, UUID_A, UUID_B, create_pod, delete_pod

Handler = Callable[[PlacementDecision, Delivery], Awaitable[None]]


def decision(uid: str, *, bind_time_ns: int = 1_780_000_000_000_000_000, node: str = NODE) -> PlacementDecision:
    return PlacementDecision(
        pod_uid=uid,
        namespace="default",
        name=f"pod-{uid}",
        node=node,
        containers=(
            ContainerPlacement(name="init", init=True),
            ContainerPlacement(
                name="main",
                devices=(
                    PlacedDevice(uuid=UUID_A, type="NVIDIA", usedmem_mib=3000, usedcores=30),
                    PlacedDevice(uuid=UUID_B, type="NVIDIA", usedmem_mib=5000, usedcores=30),
                ),
                priority=0,
            ),
        ),
        bind_time_ns=bind_time_ns,
    )


def _prestager(tmp_path: Path, pods: PodIndex | None = None, **kw: object) -> Prestager:
    config = NodeAllocationConfig(hook_path=str(tmp_path / "hook"))
    return Prestager(node=NODE, store=StagingStore(tmp_path / "staging"), config=config, pods=pods, **kw)  # type: ignore[arg-type]


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _entries(tmp_path: Path) -> list[str]:
    return sorted(n for n in os.listdir(tmp_path / "staging") if not n.startswith(".") and "-" in n)


async def _consume(bus: Bus, handler: Handler, ack_wait_s: float = 30.0) -> None:
    await bus.ensure_stream(placement_stream())
    await bus.consume(subjects.PLACEMENT_STREAM, placement_consumer(NODE, ack_wait_s), PlacementDecision, handler)


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
POD_TRACE = f"00-{TRACE_ID}-00f067aa0ba902b7-01"  # the pod's trace, as the extender's placement carries it


async def _publish(bus: Bus, *decisions: PlacementDecision) -> None:
    await bus.ensure_stream(placement_stream())
    for d in decisions:
        await bus.publish_durable(
            subjects.placement(NODE), d, msg_id=d.pod_uid, ctx=tracing.context_from_annotation(POD_TRACE)
        )


async def test_placement_is_staged_with_complete_allocate_answers(bus: Bus, tmp_path: Path) -> None:
    prestager = _prestager(tmp_path)
    await _consume(bus, prestager.on_placement)
    await _publish(bus, decision("uid-1"))
    staged = await eventually(lambda: prestager.store.get("uid-1"), what="staged entry")
    (main,) = staged.containers  # the init container has no device: the kubelet never asks for it
    envs = main.response.envs
    assert envs[envvars.NVIDIA_VISIBLE_DEVICES] == f"{UUID_A},{UUID_B}"
    assert (envs[envvars.memory_limit(0)], envs[envvars.memory_limit(1)]) == ("3000m", "5000m")
    assert (envs[envvars.CUDA_DEVICE_SM_LIMIT], envs[envvars.CUDA_TASK_PRIORITY]) == ("30", "0")
    assert (staged.node, staged.bind_time_ns, staged.name) == (NODE, 1_780_000_000_000_000_000, "pod-uid-1")
    assert staged.trace_context.split("-")[1] == TRACE_ID  # the Allocate span will continue the pod's trace
    assert _read(main.limits_host_path) == main.limits_content
    assert os.listdir(main.cache_dir) == []  # created, empty until the container's first CUDA call


async def test_redelivered_placement_is_acknowledged_without_staging_again(bus: Bus, tmp_path: Path) -> None:
    prestager = _prestager(tmp_path)
    delivery = Delivery(subject=subjects.placement(NODE), headers={}, deliveries=1)
    await prestager.on_placement(decision("uid-1"), delivery)
    first = (tmp_path / "staging" / _entries(tmp_path)[0]).read_bytes()
    await prestager.on_placement(decision("uid-1"), Delivery(delivery.subject, {}, 2))
    assert (prestager.staged, prestager.repeated) == (1, 1)
    assert (tmp_path / "staging" / _entries(tmp_path)[0]).read_bytes() == first


async def test_agent_killed_before_acknowledging_stages_each_decision_exactly_once_after_restart(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    settings = BusSettings(nats_url=nats_server.url, service_name="nodeagent-test")
    first_run = _prestager(tmp_path)
    received = asyncio.Event()

    async def stage_then_die(d: PlacementDecision, delivery: Delivery) -> None:
        await first_run.on_placement(d, delivery)  # written ...
        received.set()
        await asyncio.Event().wait()  # ... but killed before the handler returns: never acknowledged

    async with await Bus.connect(settings) as bus:
        await _publish(bus, decision("uid-1", bind_time_ns=1), decision("uid-2", bind_time_ns=2))
        await _consume(bus, stage_then_die, ack_wait_s=0.5)
        await received.wait()
    assert first_run.staged == 1

    second_run = _prestager(tmp_path)  # a new process: nothing shared but the staging directory
    async with await Bus.connect(settings) as bus:
        await _consume(bus, second_run.on_placement, ack_wait_s=0.5)
        await _publish(bus, decision("uid-3", bind_time_ns=3))
        await eventually(lambda: second_run.staged + second_run.repeated == 3, what="all decisions handled")
    assert (second_run.staged, second_run.repeated) == (2, 1)
    assert [n.split("-", 1)[1] for n in _entries(tmp_path)] == ["uid-1", "uid-2", "uid-3"]  # bind order


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        pytest.param(decision("uid-1", node="other-node"), "reached", id="a decision for another node"),
        pytest.param(
            msgspec.structs.replace(
                decision("uid-1"),
                containers=(ContainerPlacement(name="../../etc", devices=decision("x").containers[1].devices),),
            ),
            "host path",
            id="a container name that would escape the cache directory",
        ),
    ],
)
async def test_decisions_that_cannot_be_staged_are_rejected(tmp_path: Path, bad: PlacementDecision, words: str) -> None:
    prestager = _prestager(tmp_path)
    with pytest.raises(InvalidInput, match=words):
        await prestager.on_placement(bad, Delivery(subjects.placement(NODE), {}, 1))
    assert prestager.store.staged_uids() == []


async def test_consumer_drops_malformed_messages_and_keeps_staging(bus: Bus, tmp_path: Path) -> None:
    prestager = _prestager(tmp_path)
    await _consume(bus, prestager.on_placement)
    await bus.ensure_stream(placement_stream())
    await bus.publish_durable(subjects.placement(NODE), ContainerPlacement(name="not a decision"))
    await _publish(bus, decision("other", node="elsewhere"), decision("uid-ok"))
    await eventually(lambda: prestager.store.get("uid-ok"), what="the good decision staged")
    assert bus.stats.malformed == 1
    assert bus.stats.counts["rejected"] == 1
    assert prestager.store.staged_uids() == ["uid-ok"]


async def test_entries_of_deleted_pods_are_removed_and_late_decisions_skipped(
    kube: KubeClient, node: str, tmp_path: Path
) -> None:
    pods = PodIndex(node_pod_cache(kube, node))
    watch = asyncio.create_task(pods.cache.run())
    prestager = _prestager(tmp_path, pods)
    reconciler = asyncio.create_task(prestager.run_reconciler())
    try:
        uid = await create_pod(kube, "short-lived")
        await eventually(lambda: pods.get(uid), what="pod in the watch")
        delivery = Delivery(subjects.placement(NODE), {}, 1)
        await prestager.on_placement(decision(uid), delivery)
        assert prestager.store.staged_uids() == [uid]
        await delete_pod(kube, "short-lived")
        await eventually(lambda: prestager.store.staged_uids() == [], what="entry removed")
        await prestager.on_placement(decision(uid), delivery)  # a late redelivery of the gone pod
        assert (prestager.store.staged_uids(), prestager.skipped) == ([], 1)
    finally:
        for task in (watch, reconciler):
            task.cancel()
        await asyncio.gather(watch, reconciler, return_exceptions=True)


def test_staged_pods_the_watch_never_saw_are_removed_after_the_grace(tmp_path: Path) -> None:
    prestager = _prestager(tmp_path, orphan_grace=60.0)
    now = 1_780_000_000_000_000_000
    prestager.stage(decision("old", bind_time_ns=now - 61 * 10**9))
    prestager.stage(decision("fresh", bind_time_ns=now - 5 * 10**9))
    prestager.stage(decision("known", bind_time_ns=now - 600 * 10**9))
    assert prestager.reconcile([], None, now) == []  # the watch has not listed yet: nothing is judged
    assert prestager.reconcile([], {"known"}, now) == ["old"]
    assert sorted(prestager.store.staged_uids()) == ["fresh", "known"]


async def test_decision_without_devices_stages_nothing(tmp_path: Path) -> None:
    prestager = _prestager(tmp_path)
    idle = msgspec.structs.replace(decision("cpu-only"), containers=(ContainerPlacement(name="main"),))
    await prestager.on_placement(idle, Delivery(subjects.placement(NODE), {}, 1))
    assert (prestager.staged, prestager.skipped, prestager.store.staged_uids()) == (0, 1, [])
