"""The deployed NATS configuration, run by a real nats-server over TLS, with the real auth callout answering
for the node services (a fake token verifier stands in for the apiserver's TokenReview): every static
service has its own user, every node its own identity, and each may do only what ARCHITECTURE §4 gives it.
Each forbidden act is tried and must be refused; each allowed one must still work.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Final

import nats
import nats.errors
import nkeys
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from hami_common import subjects
from hami_common.bus import Bus, Delivery, placement_consumer, placement_stream
from hami_common.errors import InvalidInput
from hami_common.events import ContainerPlacement, PlacedDevice, PlacementDecision
from hami_common.settings import BusSettings
from hami_natsauth.permissions import node_identity
from hami_natsauth.responder import Authorizer
from tests.deploy.manifests import Rendering
from tests.deploy.natsconf import NatsSecrets, nats_config_users, running_nats

NODE: Final = "gpu-node-1"
OTHER: Final = "gpu-node-2"
TOKENS: Final = {"token-of-node-1": NODE, "token-of-node-2": OTHER}
WAIT_S: Final = 30.0  # generous: the machine may be busy; nothing waits this long when all is well
STATIC_USERS: Final = tuple(u for u in nats_config_users() if u != "natsauth")
ACCOUNT: Final = "HAMI"
ALL_SUBJECT_PREFIXES: Final = (
    subjects.ADMISSION,
    subjects.PLACEMENT,
    subjects.ALLOCATED,
    subjects.INVENTORY,
    subjects.USAGE,
)


class FakeVerifier:
    """Stands in for the TokenReview API: a known token proves its node, anything else is refused."""

    async def node_of(self, token: str) -> str:
        if token not in TOKENS:
            raise InvalidInput("token not authenticated")
        return TOKENS[token]


@pytest.fixture
def secrets(deploy_tree: Path) -> NatsSecrets:
    """The dev overlay's generated secrets (deploy/generate-secrets.sh --tls)."""
    generated = deploy_tree / "kustomize" / "overlays" / "dev" / "secrets"
    passwords = {user: (generated / "nats" / user).read_text() for user in nats_config_users()}
    issuer = (generated / "nats-issuer" / "issuer").read_text()
    return NatsSecrets(passwords, issuer, generated / "tls" / "nats.crt", generated / "tls" / "nats.key")


@pytest.fixture
def ca_file(deploy_tree: Path) -> Path:
    return deploy_tree / "kustomize" / "overlays" / "dev" / "secrets" / "tls" / "ca.crt"


@pytest.fixture
def deployed_nats(tmp_path: Path, secrets: NatsSecrets, renderings: dict[str, Rendering]) -> Iterator[str]:
    """nats-server started as the StatefulSet starts it, with the Secrets' values."""
    args = renderings["base"].container("hami-nats", "nats").container["args"]
    assert "--jetstream" in args
    assert "--tls" in args
    with running_nats(tmp_path, secrets, args) as url:
        yield url.replace("nats://", "tls://")


def static_settings(url: str, user: str, secrets: NatsSecrets, ca_file: Path) -> BusSettings:
    return BusSettings(
        nats_url=url,
        nats_user=user,
        nats_password=secrets.passwords[user],
        nats_ca_file=str(ca_file),
        nats_identity=user,
        service_name=user,
    )


def node_settings(url: str, token_file: Path, node: str, ca_file: Path) -> BusSettings:
    return BusSettings(
        nats_url=url,
        nats_token_file=str(token_file),
        nats_ca_file=str(ca_file),
        nats_identity=node_identity(node),
        service_name=f"nodeagent-{node}",
    )


@pytest.fixture
async def callout(deployed_nats: str, secrets: NatsSecrets, ca_file: Path, deploy_tree: Path) -> AsyncIterator[Bus]:
    """hami-natsauth's responder, signing with the generated issuer seed, connected as its user."""
    seed = (deploy_tree / "kustomize" / "overlays" / "dev" / "secrets" / "nats-issuer" / "seed").read_bytes()
    authorizer = Authorizer(FakeVerifier(), nkeys.from_seed(bytearray(seed)), account=ACCOUNT, ttl_s=3600)
    async with await Bus.connect(
        static_settings(deployed_nats, "natsauth", secrets, ca_file), give_up_after=WAIT_S
    ) as bus:
        await bus.reply(subjects.AUTH_CALLOUT, authorizer.answer)
        yield bus


class Connection:
    """One identity's raw NATS connection; permission errors the server sends land in ``denied``."""

    def __init__(self, inbox: str) -> None:
        self.denied: asyncio.Queue[str] = asyncio.Queue()
        self.nc = Client()
        self.inbox = inbox

    async def on_error(self, err: Exception) -> None:
        if "permissions violation" in str(err).lower():
            await self.denied.put(str(err))


@pytest.fixture
async def connect(
    deployed_nats: str, callout: Bus, secrets: NatsSecrets, ca_file: Path
) -> AsyncIterator[dict[str, Connection]]:
    """The extender, webhook, metrics and two nodes, each connected as it is deployed."""
    tls = ssl.create_default_context(cafile=str(ca_file))
    conns: dict[str, Connection] = {}
    for user in STATIC_USERS:
        conn = conns[user] = Connection(subjects.inbox_prefix(user))
        await conn.nc.connect(
            deployed_nats,
            user=user,
            password=secrets.passwords[user],
            tls=tls,
            inbox_prefix=conn.inbox,
            error_cb=conn.on_error,
            allow_reconnect=False,
        )
    for token, node in TOKENS.items():
        conn = conns[node] = Connection(subjects.inbox_prefix(node_identity(node)))
        await conn.nc.connect(
            deployed_nats, token=token, tls=tls, inbox_prefix=conn.inbox, error_cb=conn.on_error, allow_reconnect=False
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


async def refused(conn: Connection, what: str) -> None:
    async with asyncio.timeout(WAIT_S):
        assert what.lower() in (await conn.denied.get()).lower()  # nats-py lowercases the error


def placement_decision(node: str) -> PlacementDecision:
    device = PlacedDevice(uuid="GPU-0", type="NVIDIA", usedmem_mib=3000, usedcores=30)
    container = ContainerPlacement(name="main", init=False, devices=(device,), priority=0)
    return PlacementDecision(
        pod_uid=f"uid-{node}", namespace="team-a", name="pod-1", node=node, containers=(container,), bind_time_ns=1
    )


@pytest.mark.parametrize(
    ("subject", "allowed"),
    [
        pytest.param(subjects.placement(NODE), "extender", id="only the extender publishes placements"),
        pytest.param(subjects.usage(NODE), NODE, id="only the node's own services publish its usage"),
        pytest.param(subjects.inventory(NODE), NODE, id="only the node's own services publish its inventory"),
        pytest.param(subjects.allocated(NODE), NODE, id="only the node's own allocator publishes its results"),
        pytest.param(subjects.admission("team-a"), "webhook", id="only the webhook publishes admissions"),
    ],
)
async def test_each_subject_has_exactly_one_publishing_identity(
    connect: dict[str, Connection], subject: str, allowed: str
) -> None:
    metrics = connect["metrics"]
    received = await listen(metrics, subject)
    for who, conn in connect.items():
        await conn.nc.publish(subject, who.encode())
        await conn.nc.flush()
        if who == allowed:
            async with asyncio.timeout(WAIT_S):
                assert (await received.get()).data == who.encode()
        else:
            await refused(conn, subject)
    await metrics.nc.flush()
    assert received.empty(), "a forbidden publish was delivered"


async def test_metrics_reads_every_subject_but_publishes_nothing(connect: dict[str, Connection]) -> None:
    metrics = connect["metrics"]
    for prefix in ALL_SUBJECT_PREFIXES:
        await listen(metrics, subjects.wildcard(prefix))
    assert metrics.denied.empty()
    await metrics.nc.publish(subjects.usage(NODE), b"x")
    await refused(metrics, subjects.usage(NODE))


@pytest.mark.parametrize("verb", ["CREATE", "UPDATE", "DELETE", "PURGE"])
async def test_a_node_cannot_declare_or_change_the_placement_stream(connect: dict[str, Connection], verb: str) -> None:
    """A node re-pointing the stream's subjects made every placement fail; only the extender declares it."""
    node = connect[NODE]
    subject = f"{subjects.JS_API}.STREAM.{verb}.{subjects.PLACEMENT_STREAM}"
    await node.nc.publish(subject, b"{}")
    await node.nc.flush()
    await refused(node, subject)


async def test_a_node_cannot_read_or_ack_another_nodes_consumer(
    connect: dict[str, Connection], deployed_nats: str, secrets: NatsSecrets, ca_file: Path
) -> None:
    async with await Bus.connect(static_settings(deployed_nats, "extender", secrets, ca_file)) as extender:
        await extender.ensure_stream(placement_stream())
    other = placement_consumer(OTHER).durable
    stream = subjects.PLACEMENT_STREAM
    node = connect[NODE]
    for subject in (
        f"{subjects.JS_API}.CONSUMER.INFO.{stream}.{other}",
        f"{subjects.JS_API}.CONSUMER.MSG.NEXT.{stream}.{other}",
        f"{subjects.JS_API}.CONSUMER.DELETE.{stream}.{other}",
        f"{subjects.JS_API}.CONSUMER.CREATE.{stream}.{other}.{subjects.placement(OTHER)}",
        f"{subjects.JS_API}.CONSUMER.DURABLE.CREATE.{stream}.{other}",
        f"{subjects.JS_ACK}.{stream}.{other}.1.1.1.1.0",
    ):
        await node.nc.publish(subject, b"{}", reply=node.inbox + ".x")
        await node.nc.flush()
        await refused(node, subject)


async def test_a_node_cannot_point_its_own_consumer_at_another_nodes_placements(
    connect: dict[str, Connection], deployed_nats: str, secrets: NatsSecrets, ca_file: Path
) -> None:
    """The create subject it may use names its own filter; the server refuses a config with another."""
    async with await Bus.connect(static_settings(deployed_nats, "extender", secrets, ca_file)) as extender:
        await extender.ensure_stream(placement_stream())
    own = placement_consumer(NODE)
    config = {"name": own.durable, "durable_name": own.durable, "filter_subject": subjects.placement(OTHER)}
    config["ack_policy"] = "explicit"
    body = json.dumps({"stream_name": subjects.PLACEMENT_STREAM, "config": config}).encode()
    subject = f"{subjects.JS_API}.CONSUMER.CREATE.{subjects.PLACEMENT_STREAM}.{own.durable}.{subjects.placement(NODE)}"
    answer = await connect[NODE].nc.request(subject, body, timeout=WAIT_S)
    assert "error" in json.loads(answer.data)


async def test_no_one_reads_all_inboxes_or_another_identitys(connect: dict[str, Connection]) -> None:
    for conn in connect.values():
        await listen(conn, "_INBOX.>")
        await refused(conn, "_INBOX.>")
    for subject in (subjects.inbox_prefix(node_identity(OTHER)) + ".>", subjects.inbox_prefix("extender") + ".>"):
        await listen(connect[NODE], subject)
        await refused(connect[NODE], subject)


async def test_a_node_receives_no_other_subject(connect: dict[str, Connection]) -> None:
    for subject in (subjects.wildcard(subjects.PLACEMENT), subjects.usage(OTHER), "hami.>"):
        await listen(connect[NODE], subject)
        await refused(connect[NODE], subject)


@pytest.mark.parametrize("token", ["forged", ""], ids=["unknown token", "no token"])
async def test_a_node_without_a_valid_token_is_refused(
    deployed_nats: str, callout: Bus, ca_file: Path, token: str
) -> None:
    tls = ssl.create_default_context(cafile=str(ca_file))
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(deployed_nats, token=token or None, tls=tls, allow_reconnect=False, max_reconnect_attempts=0)


@pytest.mark.parametrize("user", STATIC_USERS)
async def test_a_wrong_password_is_refused(deployed_nats: str, callout: Bus, ca_file: Path, user: str) -> None:
    tls = ssl.create_default_context(cafile=str(ca_file))
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(
            deployed_nats, user=user, password="wrong", tls=tls, allow_reconnect=False, max_reconnect_attempts=0
        )


async def test_a_plain_text_connection_is_refused(deployed_nats: str, secrets: NatsSecrets) -> None:
    """The server asks for TLS before anything else; a client speaking plain text gets no session."""
    host, port = deployed_nats.removeprefix("tls://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    async with asyncio.timeout(WAIT_S):
        info = json.loads((await reader.readline()).removeprefix(b"INFO "))
        assert info["tls_required"] is True
        credentials = {"user": "metrics", "pass": secrets.passwords["metrics"], "verbose": False}
        writer.write(b"CONNECT " + json.dumps(credentials).encode() + b"\r\nPING\r\n")
        await writer.drain()
        rest = await reader.read()  # until the server closes the connection
    writer.close()
    assert b"PONG" not in rest


async def test_placement_reaches_the_node_agent_through_jetstream(
    deployed_nats: str, callout: Bus, secrets: NatsSecrets, ca_file: Path, tmp_path: Path
) -> None:
    """The real bus code, as each service runs it, under the deployed permissions: the extender declares the
    stream, the node's agent (its token in a file, as the kubelet projects it) consumes through its own
    durable consumer and acknowledges."""
    decision = placement_decision(NODE)
    staged: asyncio.Future[PlacementDecision] = asyncio.get_running_loop().create_future()
    token_file = tmp_path / "token"
    token_file.write_text("token-of-node-1\n")

    async def on_placement(event: PlacementDecision, delivery: Delivery) -> None:
        staged.set_result(event)

    async with (
        await Bus.connect(node_settings(deployed_nats, token_file, NODE, ca_file), give_up_after=WAIT_S) as agent,
        await Bus.connect(static_settings(deployed_nats, "extender", secrets, ca_file), give_up_after=WAIT_S) as ext,
    ):
        await ext.ensure_stream(placement_stream())
        await ext.publish_durable(subjects.placement(NODE), decision, msg_id=decision.pod_uid)
        await agent.consume(subjects.PLACEMENT_STREAM, placement_consumer(NODE), PlacementDecision, on_placement)
        async with asyncio.timeout(WAIT_S):
            assert await staged == decision
        await agent.publish(subjects.usage(NODE), decision)
        await agent.sync()
        assert agent.connected
