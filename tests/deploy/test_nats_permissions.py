"""The deployed NATS configuration, run by a real nats-server: every service has its own user, and
each may publish only what ARCHITECTURE §4 gives it (only the extender placements, only node agents usage).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Final

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from hami_common import subjects
from hami_common.bus import Bus, Delivery, placement_consumer, placement_stream
from hami_common.events import ContainerPlacement, PlacedDevice, PlacementDecision
from hami_common.settings import BusSettings
from tests.deploy.manifests import Rendering
from tests.deploy.natsconf import nats_config_users, running_nats

NODE: Final = "gpu-node-1"
WAIT_S: Final = 30.0  # generous: the machine may be busy; nothing waits this long when all is well
USERS: Final = tuple(nats_config_users())
ALL_SUBJECT_PREFIXES: Final = (
    subjects.ADMISSION,
    subjects.PLACEMENT,
    subjects.ALLOCATED,
    subjects.INVENTORY,
    subjects.USAGE,
)


@pytest.fixture
def passwords() -> dict[str, str]:
    return {user: secrets.token_hex(16) for user in USERS}


@pytest.fixture
def deployed_nats(tmp_path: Path, passwords: dict[str, str], renderings: dict[str, Rendering]) -> Iterator[str]:
    """nats-server started as the StatefulSet starts it, with the passwords in its environment."""
    args = renderings["base"].container("hami-nats", "nats").container["args"]
    assert "--jetstream" in args
    with running_nats(tmp_path, passwords, args) as url:
        yield url


class Connection:
    """One service's raw NATS connection; permission errors the server sends land in ``denied``."""

    def __init__(self) -> None:
        self.denied: asyncio.Queue[str] = asyncio.Queue()
        self.nc = Client()

    async def on_error(self, err: Exception) -> None:
        if "permissions violation" in str(err).lower():
            await self.denied.put(str(err))


@pytest.fixture
async def connect(deployed_nats: str, passwords: dict[str, str]) -> AsyncIterator[dict[str, Connection]]:
    conns = {user: Connection() for user in USERS}
    for user, conn in conns.items():
        await conn.nc.connect(
            deployed_nats, user=user, password=passwords[user], error_cb=conn.on_error, allow_reconnect=False
        )
    yield conns
    for conn in conns.values():
        await conn.nc.close()


async def listen(conn: Connection, subject: str) -> asyncio.Queue[Msg]:
    received: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        await received.put(msg)

    await conn.nc.subscribe(subject, cb=on_msg)
    # nats-py writes flush()'s PING ahead of a SUB still in its pending buffer; the second PONG vouches for
    # the SUB (without it, under load, the next publish could reach the server before the subscription)
    await conn.nc.flush()
    await conn.nc.flush()
    return received


def placement_decision() -> PlacementDecision:
    device = PlacedDevice(uuid="GPU-0", type="NVIDIA", usedmem_mib=3000, usedcores=30)
    container = ContainerPlacement(name="main", init=False, devices=(device,), priority=0)
    return PlacementDecision(
        pod_uid="uid-1", namespace="team-a", name="pod-1", node=NODE, containers=(container,), bind_time_ns=1
    )


def settings(url: str, user: str, password: str) -> BusSettings:
    return BusSettings(nats_url=url, nats_user=user, nats_password=password, service_name=user)


@pytest.mark.parametrize(
    ("subject", "allowed"),
    [
        pytest.param(subjects.placement(NODE), "extender", id="only the extender publishes placements"),
        pytest.param(subjects.usage(NODE), "nodeagent", id="only node agents publish usage"),
        pytest.param(subjects.inventory(NODE), "nodeagent", id="only node agents publish inventory"),
        pytest.param(subjects.allocated(NODE), "allocator", id="only the allocator publishes allocation results"),
        pytest.param(subjects.admission("team-a"), "webhook", id="only the webhook publishes admissions"),
    ],
)
async def test_each_subject_has_exactly_one_publishing_service(
    connect: dict[str, Connection], subject: str, allowed: str
) -> None:
    metrics = connect["metrics"]
    received = await listen(metrics, subject)
    for user, conn in connect.items():
        await conn.nc.publish(subject, user.encode())
        await conn.nc.flush()
        if user == allowed:
            async with asyncio.timeout(WAIT_S):
                assert (await received.get()).data == user.encode()
        else:
            async with asyncio.timeout(WAIT_S):
                assert subject in await conn.denied.get()
    await metrics.nc.flush()
    assert received.empty(), "a forbidden publish was delivered"


async def test_metrics_reads_every_subject_but_publishes_nothing(connect: dict[str, Connection]) -> None:
    metrics = connect["metrics"]
    for prefix in ALL_SUBJECT_PREFIXES:
        await listen(metrics, subjects.wildcard(prefix))
    assert metrics.denied.empty()
    await metrics.nc.publish(subjects.usage(NODE), b"x")
    async with asyncio.timeout(WAIT_S):
        await metrics.denied.get()


async def test_placement_reaches_the_node_agent_through_jetstream(
    deployed_nats: str, passwords: dict[str, str]
) -> None:
    """The real bus code, as each service runs it, under the deployed permissions."""
    decision = placement_decision()
    staged: asyncio.Future[PlacementDecision] = asyncio.get_running_loop().create_future()

    async def on_placement(event: PlacementDecision, delivery: Delivery) -> None:
        staged.set_result(event)

    async with (
        await Bus.connect(settings(deployed_nats, "nodeagent", passwords["nodeagent"]), give_up_after=WAIT_S) as agent,
        await Bus.connect(settings(deployed_nats, "extender", passwords["extender"]), give_up_after=WAIT_S) as extender,
    ):
        await extender.ensure_stream(placement_stream())
        await agent.ensure_stream(placement_stream())  # whoever starts first declares it
        await extender.publish_durable(subjects.placement(NODE), decision, msg_id=decision.pod_uid)
        await agent.consume(subjects.PLACEMENT_STREAM, placement_consumer(NODE), PlacementDecision, on_placement)
        async with asyncio.timeout(WAIT_S):
            assert await staged == decision


@pytest.mark.parametrize("user", USERS)
async def test_a_wrong_password_is_refused(deployed_nats: str, user: str) -> None:
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(deployed_nats, user=user, password="wrong", allow_reconnect=False, max_reconnect_attempts=0)


async def test_anonymous_clients_are_refused(deployed_nats: str) -> None:
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(deployed_nats, allow_reconnect=False, max_reconnect_attempts=0)
