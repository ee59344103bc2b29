"""A three-server NATS cluster with JetStream, as the production overlay runs it: placements published by the
extender's publisher reach a node's durable consumer and its staging store exactly once although the server
either side is connected to is killed (SIGKILL) mid-run and later restarted; the stream keeps 3 replicas."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from hami_common.allocation import NodeAllocationConfig
from hami_common.bus import Bus, NatsCluster, placement_consumer, placement_stream
from hami_common.errors import TransientError
from hami_common.events import ContainerPlacement, PlacedDevice, PlacementDecision
from hami_common.settings import BusSettings
from hami_common.staging import StagingStore
from hami_extender.publisher import PlacementPublisher
from hami_nodeagent.prestage import Prestager
from hami_sim.waiting import eventually

NODE = "gpu-node-1"
PODS = 60
WAIT_S = 60.0  # generous: a busy machine; nothing waits this long when all is well


def decision(i: int) -> PlacementDecision:
    device = PlacedDevice(uuid="GPU-0", type="NVIDIA", usedmem_mib=1000, usedcores=10)
    return PlacementDecision(
        pod_uid=f"uid-{i:03}",
        namespace="default",
        name=f"pod-{i}",
        node=NODE,
        containers=(ContainerPlacement(name="main", init=False, devices=(device,)),),
        bind_time_ns=1_000 + i,
    )


@pytest.fixture
def cluster() -> Iterator[NatsCluster]:
    with NatsCluster(3) as running:
        yield running


async def _connect(cluster: NatsCluster, name: str) -> Bus:
    return await Bus.connect(BusSettings(nats_url=cluster.url, service_name=name), give_up_after=WAIT_S)


@pytest.fixture
async def extender_bus(cluster: NatsCluster) -> AsyncIterator[Bus]:
    async with await _connect(cluster, "extender") as bus:

        async def declared() -> bool:  # the cluster elects its JetStream leader first
            try:
                await bus.ensure_stream(placement_stream(replicas=3))
            except TransientError:  # until the cluster has a JetStream leader
                return False
            return True

        await eventually(declared, timeout=WAIT_S, what="the replicated placement stream")
        yield bus


async def test_no_placement_is_lost_or_staged_twice_when_a_server_dies_and_returns(
    cluster: NatsCluster, extender_bus: Bus, tmp_path: Path
) -> None:
    store = StagingStore(tmp_path / "staging")
    prestager = Prestager(node=NODE, store=store, config=NodeAllocationConfig(hook_path=str(tmp_path / "hook")))
    publisher = PlacementPublisher(timeout=5.0, bus=extender_bus)
    async with await _connect(cluster, "nodeagent") as agent_bus:
        await agent_bus.consume(
            placement_stream().name, placement_consumer(NODE, ack_wait_s=2.0), PlacementDecision, prestager.on_placement
        )
        assert await extender_bus.stream_replicas(placement_stream().name) == 3
        # the server the extender publishes through is the one that dies
        victim = next(i for i, s in enumerate(cluster.servers) if s.url == extender_bus.connected_url)

        for i in range(PODS):
            if i == PODS // 3:
                await asyncio.to_thread(cluster.kill, victim)
            if i == 2 * PODS // 3:
                await asyncio.to_thread(cluster.revive, victim)
            # the extender publishes each bound pod once, and again only if that publish failed
            await eventually(functools.partial(publisher.publish, decision(i)), timeout=WAIT_S, what=f"pod {i}")
            await asyncio.sleep(0.02)

        await eventually(lambda: prestager.staged == PODS, timeout=WAIT_S, what="every placement staged")
        staged = sorted(p.name for p in (tmp_path / "staging").iterdir() if not p.name.startswith("."))
    assert len([n for n in staged if "uid-" in n]) == PODS, "each pod staged once, none lost"
    assert prestager.staged == PODS
    assert publisher.published == PODS
