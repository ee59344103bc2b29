"""The node handshake against the API emulator (hami-protocol §2.4): written, judged, and cleaned up."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

from hami_common.annotations import NODE_HANDSHAKE, VGPU_NODE, encode_handshake
from hami_extender.settings import ExtenderSettings
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.waiting import eventually
from tests.extender.cluster import add_node, add_pod, node_annotations, pod_annotations, set_allocatable
from tests.extender.conftest import Served, serve

_LAYOUT = "%Y-%m-%d %H:%M:%S"


def _local_now() -> datetime:
    return datetime.now().astimezone()


def _stale() -> str:
    return encode_handshake(_local_now() - timedelta(minutes=2))


def _stamp(value: str) -> datetime:
    prefix, _, stamp = value.partition("_")
    assert prefix == "Requesting"
    return datetime.strptime(stamp, _LAYOUT).replace(tzinfo=_local_now().tzinfo)


async def test_a_fresh_gpu_node_gets_requesting_written(emulator: KubeApiEmulator, extender: Served) -> None:
    before = _local_now().replace(microsecond=0)
    add_node(emulator, "node1")
    await eventually(lambda: NODE_HANDSHAKE in node_annotations(emulator, "node1"))
    stamp = _stamp(node_annotations(emulator, "node1")[NODE_HANDSHAKE])
    assert before <= stamp <= _local_now()
    assert "node1" in extender.state["ledger"]


async def test_a_node_without_gpus_gets_no_handshake(emulator: KubeApiEmulator, extender: Served) -> None:
    add_node(emulator, "cpu-only", [])
    add_node(emulator, "node1")
    await eventually(lambda: NODE_HANDSHAKE in node_annotations(emulator, "node1"))
    assert NODE_HANDSHAKE not in node_annotations(emulator, "cpu-only")


async def test_a_stale_handshake_without_allocatable_gpus_cleans_the_node_up(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    add_node(emulator, "healthy")
    add_node(emulator, "gone", allocatable=0, annotations={NODE_HANDSHAKE: _stale()})
    await eventually(lambda: NODE_HANDSHAKE not in node_annotations(emulator, "gone"))
    await eventually(lambda: "healthy" in extender.state["ledger"])
    assert "gone" not in extender.state["ledger"]
    for i in range(3):
        result = await extender.filter(add_pod(emulator, f"p{i}"), ["gone", "healthy"])
        assert result["NodeNames"] == ["healthy"]
        assert result["FailedNodes"] is None  # a success carries null, as HAMi's; "gone" is out of the ledger


async def test_allocatable_gpus_keep_a_node_with_a_stale_handshake_healthy(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    stale = _stale()
    add_node(emulator, "node1", allocatable=20, annotations={NODE_HANDSHAKE: stale})
    await eventually(lambda: "node1" in extender.state["ledger"])
    pod = add_pod(emulator, "p")
    assert (await extender.filter(pod, ["node1"]))["NodeNames"] == ["node1"]
    assert pod_annotations(emulator, "p")[VGPU_NODE] == "node1"
    assert node_annotations(emulator, "node1")[NODE_HANDSHAKE] == stale  # a Requesting value is never rewritten


async def test_a_node_whose_gpus_stop_being_allocatable_is_cleaned_up(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    add_node(emulator, "node1")
    await eventually(lambda: NODE_HANDSHAKE in node_annotations(emulator, "node1"))
    assert (await extender.filter(add_pod(emulator, "before"), ["node1"]))["NodeNames"] == ["node1"]
    set_allocatable(emulator, "node1", 0)
    await eventually(lambda: NODE_HANDSHAKE not in node_annotations(emulator, "node1"))
    assert "node1" not in extender.state["ledger"]
    refused = await extender.filter(add_pod(emulator, "after"), ["node1"])
    assert refused["FailedNodes"] == {"node1": "node unregistered"}


async def test_the_next_pass_takes_a_cleaned_node_back_with_a_fresh_handshake(
    emulator: KubeApiEmulator, settings: ExtenderSettings
) -> None:
    async with serve(dataclasses.replace(settings, node_pass_interval=0.2)) as extender:
        stale = _stale()
        add_node(emulator, "node1", allocatable=0, annotations={NODE_HANDSHAKE: stale})
        await eventually(lambda: node_annotations(emulator, "node1").get(NODE_HANDSHAKE, stale) != stale)
        await eventually(lambda: "node1" in extender.state["ledger"])
        fresh = node_annotations(emulator, "node1")[NODE_HANDSHAKE]
        assert _stamp(fresh) > _stamp(stale)
        assert extender.state["handshakes"].cleaned_up >= 1


async def test_only_the_leader_writes_handshakes(emulator: KubeApiEmulator, settings: ExtenderSettings) -> None:
    elect = dataclasses.replace(settings, leader_elect=True, lease_namespace="default", lease_duration=2)
    async with serve(dataclasses.replace(elect, identity="one")) as one:
        await eventually(lambda: one.state["leadership"].leading)
        async with serve(dataclasses.replace(elect, identity="two")) as two:
            add_node(emulator, "node1")
            await eventually(lambda: "node1" in two.state["ledger"] and "node1" in one.state["ledger"])
            await eventually(lambda: one.state["handshakes"].written == 1)
            assert NODE_HANDSHAKE in node_annotations(emulator, "node1")
            assert two.state["handshakes"].written == 0
