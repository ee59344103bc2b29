"""The ledger across restarts, quotas, events, leadership, NATS outages, dry runs and authentication."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from hami_common.annotations import DEVICE_CORDON, NODE_REGISTER, VGPU_NODE, encode_node_devices
from hami_common.kube import KubeClient
from hami_extender.settings import ExtenderSettings
from hami_sim.kubeapi import KubeApiEmulator, parse_field_selector, parse_label_selector
from hami_sim.waiting import eventually
from tests.extender.cluster import EVENTS, QUOTAS, add_node, add_pod, cards, gpu_container, pod_annotations
from tests.extender.conftest import Served, serve


async def test_a_restarted_extender_rebuilds_the_identical_ledger(
    emulator: KubeApiEmulator, extender: Served, settings: ExtenderSettings
) -> None:
    for node in ("node1", "node2"):
        add_node(emulator, node)
    await eventually(lambda: "node1" in extender.state["ledger"] and "node2" in extender.state["ledger"])
    init_pod = add_pod(emulator, "two-containers", containers=[gpu_container("a", mem=300), gpu_container("b")])
    pods = [add_pod(emulator, f"p{i}", containers=[gpu_container(mem=500 + i, cores=10)]) for i in range(4)]
    for pod in [init_pod, *pods]:
        assert (await extender.filter(pod, ["node1", "node2"]))["NodeNames"]
    await extender.bind(pods[0], pod_annotations(emulator, "p0")[VGPU_NODE])
    uids = {p["metadata"]["uid"] for p in [init_pod, *pods]}
    first = extender.state["ledger"]
    await eventually(lambda: all(first.booking(u) is not None for u in uids))
    async with serve(dataclasses.replace(settings, identity="second")) as second:
        rebuilt = second.state["ledger"]
        await eventually(lambda: all(rebuilt.booking(u) is not None for u in uids))
        assert rebuilt.state() == first.state()


async def test_namespace_quota_refuses_cards_beyond_the_limit(emulator: KubeApiEmulator, extender: Served) -> None:
    add_node(emulator, "node1")
    emulator.store.create(
        QUOTAS,
        "default",
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": "default"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "1500"}},
        },
    )
    await eventually(lambda: "node1" in extender.state["ledger"] and extender.state["ledger"].quota("default"))
    assert (await extender.filter(add_pod(emulator, "a"), ["node1"]))["NodeNames"] == ["node1"]
    refused = await extender.filter(add_pod(emulator, "b"), ["node1"])
    assert refused["FailedNodes"] == {"node1": "2/2 ResourceQuotaNotFit"}


def _reasons(emulator: KubeApiEmulator) -> set[tuple[str, str]]:
    everything = parse_label_selector(""), parse_field_selector("", lambda _: True)
    items, _ = emulator.store.list_matching(EVENTS, "default", *everything)
    return {(e["reason"], e["involvedObject"]["name"]) for e in items}


@pytest.mark.parametrize("successes", [True, False], ids=["success events on", "by default"])
async def test_filtering_records_hamis_events(
    emulator: KubeApiEmulator, settings: ExtenderSettings, successes: bool
) -> None:
    """HAMi's failure Events always; its success Events only when asked for (kube-scheduler's own Scheduled
    event records every placement, and each success Event is one more apiserver write per pod)."""
    add_node(emulator, "node1")
    async with serve(dataclasses.replace(settings, success_events=successes) if successes else settings) as extender:
        await eventually(lambda: "node1" in extender.state["ledger"])
        await extender.filter(add_pod(emulator, "fits"), ["node1"])
        await extender.filter(add_pod(emulator, "huge", containers=[gpu_container(mem=99999)]), ["node1"])
        await eventually(lambda: ("FilteringFailed", "huge") in _reasons(emulator))
        if successes:
            await eventually(lambda: ("FilteringSucceed", "fits") in _reasons(emulator))
        else:  # events are recorded in order: "fits" was filtered before "huge"
            assert not any(reason.endswith("Succeed") for reason, _ in _reasons(emulator))


async def test_scheduling_goes_on_when_nats_is_down(emulator: KubeApiEmulator, settings: ExtenderSettings) -> None:
    down = dataclasses.replace(settings, nats_url="nats://127.0.0.1:1", publish_timeout=0.2)
    async with serve(down) as extender:
        add_node(emulator, "node1")
        await eventually(lambda: "node1" in extender.state["ledger"])
        pod = add_pod(emulator, "p1")
        assert (await extender.filter(pod, ["node1"]))["NodeNames"] == ["node1"]
        assert await extender.bind(pod, "node1") == {"Error": ""}
        ready = (await extender.client.get("/readyz")).json()
        assert (ready["placements_published"], ready["placements_unpublished"]) == (0, 1)


async def test_only_the_lease_holder_filters_and_readyz_says_who_leads(
    emulator: KubeApiEmulator, settings: ExtenderSettings
) -> None:
    elect = dataclasses.replace(settings, leader_elect=True, lease_namespace="default", lease_duration=2)
    async with serve(dataclasses.replace(elect, identity="one")) as one:
        await eventually(lambda: one.state["leadership"].leading)
        async with serve(dataclasses.replace(elect, identity="two")) as two:
            add_node(emulator, "node1")
            await eventually(lambda: "node1" in two.state["ledger"])
            result = await two.filter(add_pod(emulator, "p"), ["node1"])
            assert result["Error"] == "two is not the leader; retry against the leader"
            assert (await two.client.get("/readyz")).json()["leader"] is False
            assert (await one.client.get("/readyz")).json()["leader"] is True
            assert (await one.filter(add_pod(emulator, "q"), ["node1"]))["NodeNames"] == ["node1"]


async def test_the_bearer_token_guards_the_verbs_but_not_the_probes(
    emulator: KubeApiEmulator, settings: ExtenderSettings
) -> None:
    async with serve(dataclasses.replace(settings, bearer_token="s3cret")) as extender:
        body: dict[str, Any] = {"Pod": {}, "NodeNames": []}
        assert (await extender.client.post("/filter", json=body)).status_code == 401
        authorised = await extender.client.post("/filter", json=body, headers={"Authorization": "Bearer s3cret"})
        assert authorised.status_code == 200
        assert (await extender.client.get("/healthz")).status_code == 200


def registration(node: str, devmem: int = 8000) -> str:
    return encode_node_devices(cards(node, devmem=devmem))


async def test_dry_run_with_full_nodes_answers_the_best_node_without_side_effects(
    emulator: KubeApiEmulator, extender: Served
) -> None:
    pod = add_pod(emulator, "sim")
    nodes = [
        {
            "metadata": {
                "name": "small",
                "annotations": {NODE_REGISTER: encode_node_devices(cards("small", devmem=100))},
            }
        },
        {"metadata": {"name": "big", "annotations": {NODE_REGISTER: encode_node_devices(cards("big"))}}},
        {"metadata": {"name": "bare"}},
    ]
    response = await extender.client.post(
        "/filter", content=json.dumps({"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None})
    )
    result = response.json()
    assert [item["metadata"]["name"] for item in result["Nodes"]["items"]] == ["big"]
    assert result["FailedNodes"] == {"small": "2/2 CardInsufficientMemory", "bare": "node unregistered"}
    assert VGPU_NODE not in pod_annotations(emulator, "sim")


async def test_registration_changes_reach_the_ledger(
    emulator: KubeApiEmulator, extender: Served, settings: ExtenderSettings
) -> None:
    add_node(emulator, "node1", cards("node1", n=1))
    await eventually(lambda: "node1" in extender.state["ledger"])
    async with KubeClient.from_settings(settings.kube()) as kube:
        await kube.patch_node_annotations("node1", {DEVICE_CORDON: "GPU-node1-0"})
    result = await eventually_filter(extender, emulator)
    assert result["FailedNodes"] == {"node1": "1/1 CardCordoned"}


async def eventually_filter(extender: Served, emulator: KubeApiEmulator) -> dict[str, Any]:
    await eventually(lambda: bool(extender.state["ledger"].view("node1").usage.cordoned))
    return await extender.filter(add_pod(emulator, "late"), ["node1"])
