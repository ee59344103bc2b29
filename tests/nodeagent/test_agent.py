"""The whole node agent against a real nats-server and the kube emulator, and its command line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from hami_common import subjects
from hami_common.annotations import NODE_REGISTER, decode_node_devices
from hami_common.bus import Bus, Delivery, EmbeddedNats, placement_stream
from hami_common.errors import TransientError
from hami_common.events import DeviceSample, NodeInventory, PodEnded, UsageMessage, UsageSample
from hami_common.inventory import FakeInventory, NvmlInventory
from hami_common.kube import KubeClient, KubeSettings
from hami_common.staging import StagingStore
from hami_nodeagent.agent import NodeAgent, run_connected
from hami_nodeagent.settings import NodeAgentSettings
from hami_sim.sharedcache_writer import write_cache
from hami_sim.waiting import eventually
from tests.nodeagent.conftest import NODE, UUID_A, create_pod, delete_pod, inventory_doc, write_inventory
from tests.nodeagent.test_prestage import decision
from tests.nodeagent.test_usage import CACHE


@pytest.fixture
def settings(
    nats_server: EmbeddedNats, kube_settings: KubeSettings, inventory_file: Path, tmp_path: Path
) -> NodeAgentSettings:
    return NodeAgentSettings(
        nats_url=nats_server.url,
        service_name="nodeagent-test",
        kubeconfig=kube_settings.kubeconfig,
        kube_timeout=5.0,
        kube_backoff_initial=0.02,
        kube_backoff_max=0.2,
        node_name=NODE,
        inventory="fake",
        fake_inventory=str(inventory_file),
        staging_dir=str(tmp_path / "staging"),
        hook_path=str(tmp_path / "hook"),
        health_interval=0.05,
        register_interval=0.5,
        usage_interval=0.05,
        placement_ack_wait=1.0,
    )


@pytest.fixture
async def agent(settings: NodeAgentSettings, kube: KubeClient, node: str) -> AsyncIterator[NodeAgent]:
    stop = asyncio.Event()
    inventory = FakeInventory(settings.fake_inventory, NODE)
    async with await Bus.connect(settings) as bus:
        running = NodeAgent(settings, bus, kube, inventory)
        task = asyncio.create_task(running.run(stop))
        yield running
        stop.set()
        await asyncio.wait_for(task, 10)


async def _registered(kube: KubeClient) -> str | None:
    return (await kube.get_node(NODE)).metadata.annotations.get(NODE_REGISTER)


async def test_agent_registers_and_follows_gpu_health(
    agent: NodeAgent, kube: KubeClient, bus: Bus, inventory_file: Path
) -> None:
    inventories: asyncio.Queue[NodeInventory] = asyncio.Queue()

    async def on_inventory(event: NodeInventory, _: Delivery) -> None:
        await inventories.put(event)

    await bus.subscribe(subjects.inventory(NODE), NodeInventory, on_inventory)
    raw = await eventually(lambda: _registered(kube), what="registration")
    assert [d.health for d in decode_node_devices(raw)] == [True, True]
    await asyncio.wait_for(inventories.get(), 10)  # the full checks keep publishing the inventory
    write_inventory(inventory_file, inventory_doc(healthy_b=False))

    async def unhealthy() -> bool:
        raw = await _registered(kube)
        return raw is not None and [d.health for d in decode_node_devices(raw)] == [True, False]

    await eventually(unhealthy, what="GPU B registered unhealthy")


async def test_agent_stages_placements_and_streams_usage(
    agent: NodeAgent, settings: NodeAgentSettings, kube: KubeClient, bus: Bus
) -> None:
    usage: asyncio.Queue[UsageSample] = asyncio.Queue()

    async def on_usage(event: UsageSample, _: Delivery) -> None:
        await usage.put(event)

    await bus.subscribe(subjects.usage(NODE), UsageSample, on_usage)
    uid = await create_pod(kube, "trainer")
    await bus.ensure_stream(placement_stream())
    await bus.publish_durable(subjects.placement(NODE), decision(uid), msg_id=uid)
    store = StagingStore(settings.staging_dir)
    staged = await eventually(lambda: store.get(uid), what="placement staged")
    (main,) = staged.containers
    write_cache(Path(main.cache_dir) / "x.cache", CACHE)  # what libvgpu.so would leave there
    sample = await asyncio.wait_for(usage.get(), 10)
    while sample.pod_uid != uid:
        sample = await asyncio.wait_for(usage.get(), 10)
    assert (sample.pod, sample.container, sample.device_uuid, sample.limit_bytes) == (
        "trainer", "main", UUID_A, 3000 * 1024 * 1024,
    )  # fmt: skip
    await delete_pod(kube, "trainer")
    await eventually(lambda: store.staged_uids() == [], what="staged entry of the deleted pod removed")


def test_usage_messages_decode_as_the_metrics_service_reads_them() -> None:
    decoder = msgspec.msgpack.Decoder(UsageMessage)
    report = UsageSample(
        node=NODE, pod_uid="u", namespace="ns", pod="p", container="c", device_uuid=UUID_A, used_bytes=5,
        limit_bytes=9, at_ns=1, vdevice_index=0, context_bytes=1, module_bytes=2, buffer_bytes=3, last_kernel_at_s=4,
    )  # fmt: skip
    device = DeviceSample(node=NODE, device_uuid=UUID_A, index=0, name="T4", memory_used_bytes=7, at_ns=1)
    ended = PodEnded(node=NODE, pod_uid="u", namespace="ns", name="p", at_ns=2)
    for message in (report, device, ended):
        assert msgspec.to_builtins(decoder.decode(msgspec.msgpack.encode(message))) == msgspec.to_builtins(message)
    plain = msgspec.msgpack.decode(msgspec.msgpack.encode(report), type=UsageSample)
    assert (plain.used_bytes, plain.device_uuid) == (5, UUID_A)


def _main(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hami_nodeagent.main", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, "OTEL_SDK_DISABLED": "true", **(env or {})},
    )  # fmt: skip


def test_command_line_refuses_an_unchosen_or_unusable_inventory(tmp_path: Path) -> None:
    unchosen = _main("--node-name", NODE)
    assert unchosen.returncode == 2
    assert "--inventory must be chosen explicitly" in unchosen.stderr
    missing = _main("--node-name", NODE, "--inventory", "fake", "--fake-inventory", str(tmp_path / "absent.yaml"))
    assert missing.returncode == 2
    assert "absent.yaml" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert _main("--help").returncode == 0


def test_command_line_with_nvml_and_no_driver_stops_instead_of_falling_back(tmp_path: Path) -> None:
    try:
        NvmlInventory().close()
    except TransientError:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver")
    done = _main("--node-name", NODE, "--inventory", "nvml", env={"HAMI_FAKE_INVENTORY": str(tmp_path / "x.yaml")})
    assert done.returncode == 69  # EX_UNAVAILABLE: the configured backend cannot start
    assert "NVML" in done.stderr


async def test_agent_starts_again_on_a_new_connection_when_nats_py_closed_its_own(
    settings: NodeAgentSettings, kube: KubeClient, node: str, bus: Bus
) -> None:
    """nats-py closes a connection for good when a reconnect is refused; placements must still be staged."""
    connections: list[Bus] = []

    async def connect(s: NodeAgentSettings) -> Bus:
        connections.append(await Bus.connect(s))
        return connections[-1]

    stop = asyncio.Event()
    inventory = FakeInventory(settings.fake_inventory, NODE)
    running = asyncio.create_task(run_connected(settings, kube, inventory, stop, connect))
    store = StagingStore(settings.staging_dir)
    await bus.ensure_stream(placement_stream())
    try:
        first = await create_pod(kube, "before")
        await bus.publish_durable(subjects.placement(NODE), decision(first), msg_id=first)
        await eventually(lambda: store.get(first), what="first placement staged")
        await connections[0].drain()  # closed for good, as nats-py leaves it
        second = await create_pod(kube, "after")
        await bus.publish_durable(subjects.placement(NODE), decision(second), msg_id=second)
        await eventually(lambda: store.get(second), what="placement staged over the new connection")
        assert len(connections) == 2
        assert not connections[1].closed
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
    assert connections[1].closed  # drained at the end
