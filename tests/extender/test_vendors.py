"""A mixed cluster through the real HTTP extender (issue 20): NVIDIA, Ascend, Cambricon and Hygon nodes.

The families come from a device-config file, as the chart mounts it; nodes carry what each vendor's
device plugin writes (register and handshake annotations, or node capacity for Cambricon).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from hami_common.annotations import (
    DEVICES_ALLOCATED,
    GRANT_SIGNATURE,
    NODE_LOCK,
    VGPU_NODE,
    VGPU_TIME,
    DeviceInfo,
    decode_pod_devices,
    decode_rfc3339,
    encode_handshake,
)
from hami_common.grants import GrantKey, unverified_reason
from hami_common.resources import GPU
from hami_common.vendors.ascend import keys as ascend
from hami_common.vendors.ascend.register import RegisteredNpu
from hami_common.vendors.ascend.register import encode_register as encode_npus
from hami_common.vendors.cambricon import keys as cambricon
from hami_common.vendors.hygon import encode_register as encode_dcus
from hami_common.vendors.hygon import keys as hygon
from hami_extender.settings import ExtenderSettings
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.waiting import eventually
from tests.extender.cluster import NODES, PODS, QUOTAS, add_node, add_pod, node_annotations, pod_annotations
from tests.extender.conftest import Served, serve

B3 = "Ascend910B3"
NPU_COUNT = "huawei.com/Ascend910B3"
ALL_FAMILIES = "vnpus:\n  enabled: true\ncambricon: {}\nhygon: {}\n"


@pytest.fixture
def mixed_settings(settings: ExtenderSettings, tmp_path: Path) -> ExtenderSettings:
    return _with_config(settings, tmp_path, ALL_FAMILIES)


def _with_config(settings: ExtenderSettings, tmp_path: Path, text: str) -> ExtenderSettings:
    path = tmp_path / "device-config.yaml"
    path.write_text(text)
    return dataclasses.replace(settings, device_config_file=str(path))


def _reported() -> str:
    return "Reported_" + datetime.now().strftime("%Y.%m.%d %H:%M:%S")


def _add(api: KubeApiEmulator, name: str, annotations: dict[str, str], resources: dict[str, str]) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }
    api.store.create(NODES, None, body)


def npus(node: str, n: int = 2) -> str:
    return encode_npus(
        tuple(
            RegisteredNpu(
                id=f"{node}-npu{i}",
                index=i,
                count=4,
                devmem=65536,
                devcore=20,
                type=B3,
                health=True,
                custominfo={ascend.NETWORK_ID: 0},
            )
            for i in range(n)
        )
    )


def dcus(node: str, n: int = 2) -> str:
    return encode_dcus(
        [
            DeviceInfo(
                id=f"{node}-dcu{i}",
                index=i,
                count=4,
                devmem=16384,
                devcore=100,
                type="DCU-Z100",
                mode="hami-core",
                health=True,
            )
            for i in range(n)
        ]
    )


def add_ascend_node(api: KubeApiEmulator, name: str, *, handshake: str | None = None, allocatable: int = 8) -> None:
    anns = {ascend.register_key(B3): npus(name), ascend.handshake_key(B3): handshake or _reported()}
    _add(api, name, anns, {NPU_COUNT: str(allocatable)})


def add_dcu_node(api: KubeApiEmulator, name: str) -> None:
    anns = {hygon.NODE_REGISTER: dcus(name), hygon.NODE_HANDSHAKE: _reported()}
    _add(api, name, anns, {hygon.DCU_COUNT: "8"})


def add_mlu_node(api: KubeApiEmulator, name: str) -> None:
    # 200 % of vcore = two MLUs; 192 units of 256 MiB shared out: 24576 MiB each
    _add(api, name, {}, {cambricon.MLU_CORES: "200", cambricon.MLU_MEMORY: "192"})


def ctr(limits: dict[str, str], name: str = "main") -> dict[str, Any]:
    return {"name": name, "image": "img", "resources": {"limits": limits}}


GPU_SLICE = {GPU: "1", "nvidia.com/gpumem": "1000"}
VNPU = {NPU_COUNT: "1", "huawei.com/Ascend910B3-memory": "16384"}
DCU_SLICE = {hygon.DCU_COUNT: "1", hygon.DCU_MEMORY: "2000"}
MLU_SLICE = {cambricon.MLU_COUNT: "1", cambricon.MLU_MEMORY: "8", cambricon.MLU_CORES: "10"}
NODE_NAMES = ["gpu", "npu", "dcu", "mlu"]


def _cluster(api: KubeApiEmulator) -> None:
    add_node(api, "gpu")
    add_ascend_node(api, "npu")
    add_dcu_node(api, "dcu")
    add_mlu_node(api, "mlu")


def _registered(extender: Served, *names: str) -> bool:
    return all(n in extender.state["ledger"] for n in names)


def _cards(extender: Served, node: str) -> list[str]:
    return [d.type for d in extender.state["ledger"].view(node).usage.devices]


# --- filter ------------------------------------------------------------------------------------------------


async def test_each_family_lands_on_its_own_nodes_with_its_own_annotations(
    emulator: KubeApiEmulator, mixed_settings: ExtenderSettings
) -> None:
    _cluster(emulator)
    async with serve(mixed_settings) as extender:
        await eventually(lambda: _registered(extender, *NODE_NAMES))
        assert _cards(extender, "mlu") == ["MLU", "MLU"]
        placed = {}
        for pod, limits in (("g", GPU_SLICE), ("a", VNPU), ("d", DCU_SLICE), ("m", MLU_SLICE)):
            result = await extender.filter(add_pod(emulator, pod, containers=[ctr(limits)]), NODE_NAMES)
            placed[pod] = result["NodeNames"]
        assert placed == {"g": ["gpu"], "a": ["npu"], "d": ["dcu"], "m": ["mlu"]}

    g, a, d, m = (pod_annotations(emulator, p) for p in "gadm")
    assert DEVICES_ALLOCATED in g
    for anns, node in ((a, "npu"), (d, "dcu"), (m, "mlu")):
        assert anns[VGPU_NODE] == node
        assert VGPU_TIME in anns
        assert DEVICES_ALLOCATED not in anns  # NVIDIA's list is written for NVIDIA devices only
    [npu] = decode_pod_devices(a[ascend.devices_allocated_key(B3)])[0]
    assert npu.type == B3
    assert npu.usedmem == 16384
    assert npu.uuid.startswith("npu-npu")
    assert a[ascend.devices_to_allocate_key(B3)] == a[ascend.devices_allocated_key(B3)]
    assert '"temp":"vir05_1c_16g"' in a[ascend.runtime_key(B3)]
    assert a[ascend.PREDICATE_TIME] == a[VGPU_TIME]
    [dev] = decode_pod_devices(d[hygon.DEVICES_ALLOCATED])[0]
    assert (dev.type, dev.usedmem) == ("DCU", 2000)
    assert m[cambricon.DSMLU_PROFILE].endswith("_10_8")  # <index>_<cores>_<memory units>
    assert m[cambricon.DSMLU_ASSIGHED] == m[cambricon.DSMLU_ASSIGNED] == "false"


async def test_one_container_asking_nvidia_and_dcu_gets_both_on_one_node(
    emulator: KubeApiEmulator, mixed_settings: ExtenderSettings, tmp_path: Path
) -> None:
    key = GrantKey(b"k" * 32)
    key_file = tmp_path / "grant.key"
    key_file.write_bytes(key.secret)
    add_node(emulator, "both", annotations={hygon.NODE_REGISTER: dcus("both"), hygon.NODE_HANDSHAKE: _reported()})
    emulator.store.update(
        NODES,
        None,
        "both",
        lambda n: {
            **n,
            "status": {"capacity": {GPU: "20", hygon.DCU_COUNT: "8"}, "allocatable": {GPU: "20", hygon.DCU_COUNT: "8"}},
        },
        subresource="status",
    )
    add_node(emulator, "gpu-only")
    async with serve(dataclasses.replace(mixed_settings, grant_key_file=str(key_file))) as extender:
        await eventually(lambda: _registered(extender, "both", "gpu-only") and "DCU-Z100" in _cards(extender, "both"))
        pod = add_pod(emulator, "p", containers=[ctr({**GPU_SLICE, **DCU_SLICE})])
        result = await extender.filter(pod, ["gpu-only", "both"])
        assert result["NodeNames"] == ["both"]
    anns = pod_annotations(emulator, "p")
    [gpu] = decode_pod_devices(anns[DEVICES_ALLOCATED])[0]
    [dcu] = decode_pod_devices(anns[hygon.DEVICES_ALLOCATED])[0]
    assert gpu.uuid.startswith("GPU-both")
    assert dcu.uuid.startswith("both-dcu")
    uid = pod["metadata"]["uid"]
    assert GRANT_SIGNATURE in anns
    assert unverified_reason(key, uid, anns) == ""
    forged = {**anns, hygon.DEVICES_ALLOCATED: anns[hygon.DEVICES_ALLOCATED].replace("2000", "16000")}
    assert unverified_reason(key, uid, forged) != ""  # the DCU list is covered by the signature too


async def test_failed_nodes_give_each_familys_reason(
    emulator: KubeApiEmulator, mixed_settings: ExtenderSettings
) -> None:
    _cluster(emulator)
    async with serve(mixed_settings) as extender:
        await eventually(lambda: _registered(extender, *NODE_NAMES))
        too_big = {hygon.DCU_COUNT: "1", hygon.DCU_MEMORY: "20000"}
        result = await extender.filter(add_pod(emulator, "big", containers=[ctr(too_big)]), ["dcu", "gpu", "npu"])
    assert result["NodeNames"] is None
    assert result["FailedNodes"] == {
        "dcu": "2/2 CardInsufficientMemory",
        "gpu": "NodeInsufficientDevice",
        "npu": "NodeInsufficientDevice",
    }


async def test_a_namespace_quota_on_cambricon_memory_bounds_mlu_pods_and_not_nvidia_pods(
    emulator: KubeApiEmulator, mixed_settings: ExtenderSettings
) -> None:
    add_mlu_node(emulator, "mlu")
    add_node(emulator, "gpu")
    hard = {f"limits.{cambricon.MLU_MEMORY}": "10"}  # 10 units of 256 MiB
    body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "mlu", "namespace": "default"}}
    emulator.store.create(QUOTAS, "default", {**body, "spec": {"hard": hard}})
    async with serve(mixed_settings) as extender:
        await eventually(
            lambda: _registered(extender, "mlu", "gpu") and extender.state["ledger"].family_quotas("default")
        )
        first = add_pod(emulator, "m1", containers=[ctr(MLU_SLICE)])  # 8 units
        assert (await extender.filter(first, ["mlu", "gpu"]))["NodeNames"] == ["mlu"]
        second = add_pod(emulator, "m2", containers=[ctr(MLU_SLICE)])  # 8 more: 16 > 10
        result = await extender.filter(second, ["mlu"])
        assert result["FailedNodes"] == {"mlu": "2/2 ResourceQuotaNotFit"}
        nvidia = add_pod(emulator, "g", containers=[ctr(GPU_SLICE)])
        assert (await extender.filter(nvidia, ["gpu"]))["NodeNames"] == ["gpu"]


# --- bind: locks -------------------------------------------------------------------------------------------


async def test_a_cambricon_bind_takes_its_own_rfc3339_lock_and_refuses_a_second_within_two_minutes(
    emulator: KubeApiEmulator, mixed_settings: ExtenderSettings
) -> None:
    add_mlu_node(emulator, "mlu")
    async with serve(mixed_settings) as extender:
        await eventually(lambda: _registered(extender, "mlu"))
        first = add_pod(emulator, "m1", containers=[ctr(MLU_SLICE)])
        assert (await extender.filter(first, ["mlu"]))["NodeNames"] == ["mlu"]
        assert (await extender.bind(first, "mlu"))["Error"] == ""
        anns = node_annotations(emulator, "mlu")
        locked_at = decode_rfc3339(anns[cambricon.NODE_LOCK], cambricon.NODE_LOCK)
        assert abs(datetime.now().astimezone() - locked_at) < timedelta(minutes=1)
        assert NODE_LOCK not in anns  # Cambricon does not use HAMi's shared lock
        second = add_pod(emulator, "m2", containers=[ctr(MLU_SLICE)])
        assert (await extender.filter(second, ["mlu"]))["NodeNames"] == ["mlu"]
        answer = await extender.bind(second, "mlu")
        assert "locked within 120s" in answer["Error"]
        assert emulator.store.get(PODS, "default", "m2")["spec"].get("nodeName") is None


async def test_an_expired_cambricon_lock_is_replaced(
    emulator: KubeApiEmulator, mixed_settings: ExtenderSettings
) -> None:
    add_mlu_node(emulator, "mlu")
    old = "2020-01-01T00:00:00Z"
    emulator.store.update(
        NODES, None, "mlu", lambda n: {**n, "metadata": {**n["metadata"], "annotations": {cambricon.NODE_LOCK: old}}}
    )
    async with serve(mixed_settings) as extender:
        await eventually(lambda: _registered(extender, "mlu"))
        pod = add_pod(emulator, "m", containers=[ctr(MLU_SLICE)])
        assert (await extender.filter(pod, ["mlu"]))["NodeNames"] == ["mlu"]
        assert (await extender.bind(pod, "mlu"))["Error"] == ""
    assert node_annotations(emulator, "mlu")[cambricon.NODE_LOCK] != old


async def test_an_ascend_bind_takes_hamis_shared_lock(
    emulator: KubeApiEmulator, mixed_settings: ExtenderSettings
) -> None:
    add_ascend_node(emulator, "npu")
    async with serve(mixed_settings) as extender:
        await eventually(lambda: _registered(extender, "npu"))
        pod = add_pod(emulator, "a", containers=[ctr(VNPU)])
        assert (await extender.filter(pod, ["npu"]))["NodeNames"] == ["npu"]
        assert (await extender.bind(pod, "npu"))["Error"] == ""
    assert node_annotations(emulator, "npu")[NODE_LOCK].endswith(",default,a")
    assert emulator.store.get(PODS, "default", "a")["spec"]["nodeName"] == "npu"


# --- handshake ---------------------------------------------------------------------------------------------


async def test_each_family_with_a_handshake_gets_requesting_written_on_its_own_key(
    emulator: KubeApiEmulator, mixed_settings: ExtenderSettings
) -> None:
    _cluster(emulator)
    async with serve(mixed_settings) as extender:
        await eventually(lambda: _registered(extender, *NODE_NAMES))

        def requesting(node: str, key: str) -> bool:
            return node_annotations(emulator, node).get(key, "").startswith("Requesting_")

        await eventually(
            lambda: requesting("npu", ascend.handshake_key(B3)) and requesting("dcu", hygon.NODE_HANDSHAKE)
        )
    assert not any("handshake" in k for k in node_annotations(emulator, "mlu"))  # Cambricon has none


async def test_a_family_failing_its_handshake_loses_only_its_devices(
    emulator: KubeApiEmulator, mixed_settings: ExtenderSettings
) -> None:
    stale = encode_handshake(datetime.now().astimezone() - timedelta(minutes=2))
    add_node(emulator, "both", annotations={ascend.register_key(B3): npus("both"), ascend.handshake_key(B3): stale})
    # NVIDIA's GPUs are allocatable, the NPUs are not: the Ascend handshake fails, NVIDIA's holds
    async with serve(mixed_settings) as extender:
        await eventually(lambda: ascend.handshake_key(B3) not in node_annotations(emulator, "both"))
        assert _registered(extender, "both")
        assert all(t.startswith("NVIDIA") for t in _cards(extender, "both"))
        result = await extender.filter(add_pod(emulator, "a", containers=[ctr(VNPU)]), ["both"])
        assert result["FailedNodes"] == {"both": "NodeInsufficientDevice"}
        result = await extender.filter(add_pod(emulator, "g", containers=[ctr(GPU_SLICE)]), ["both"])
        assert result["NodeNames"] == ["both"]


async def test_a_malformed_family_annotation_keeps_the_nodes_nvidia_cards(
    emulator: KubeApiEmulator, mixed_settings: ExtenderSettings
) -> None:
    add_node(emulator, "gpu", annotations={hygon.NODE_REGISTER: "garbage", hygon.NODE_HANDSHAKE: _reported()})
    async with serve(mixed_settings) as extender:
        await eventually(lambda: _registered(extender, "gpu"))
        assert all(t.startswith("NVIDIA") for t in _cards(extender, "gpu"))
        result = await extender.filter(add_pod(emulator, "g", containers=[ctr(GPU_SLICE)]), ["gpu"])
        assert result["NodeNames"] == ["gpu"]


# --- restart -----------------------------------------------------------------------------------------------


async def test_a_restarted_extender_rebuilds_every_familys_bookings(
    emulator: KubeApiEmulator, mixed_settings: ExtenderSettings
) -> None:
    _cluster(emulator)
    async with serve(mixed_settings) as extender:
        await eventually(lambda: _registered(extender, *NODE_NAMES))
        pods = [("g", GPU_SLICE), ("a", VNPU), ("d", DCU_SLICE), ("m", MLU_SLICE)]
        for name, limits in pods:
            result = await extender.filter(add_pod(emulator, name, containers=[ctr(limits)]), NODE_NAMES)
            assert result["NodeNames"] is not None
        before = extender.state["ledger"].state()
    assert len(before.bookings) == 4
    async with serve(mixed_settings) as restarted:
        ledger = restarted.state["ledger"]
        await eventually(lambda: _registered(restarted, *NODE_NAMES) and len(ledger.state().bookings) == 4)
        assert ledger.state() == before
        used = [d for d in ledger.view("npu").usage.devices if d.used]
        assert [(d.used, d.usedmem) for d in used] == [(1, 16384)]


# --- configuration -----------------------------------------------------------------------------------------


async def test_a_family_the_device_config_does_not_enable_is_ignored(
    emulator: KubeApiEmulator, settings: ExtenderSettings, tmp_path: Path
) -> None:
    add_node(emulator, "gpu")
    add_ascend_node(emulator, "npu")
    add_dcu_node(emulator, "dcu")
    only_hygon = _with_config(settings, tmp_path, "vnpus:\n  enabled: false\nhygon: {}\n")
    async with serve(only_hygon) as extender:
        await eventually(lambda: _registered(extender, "gpu", "dcu"))
        assert "npu" not in extender.state["ledger"]
        pod = add_pod(emulator, "a", containers=[ctr(VNPU)])
        result = await extender.filter(pod, ["gpu", "npu", "dcu"])
        assert result["NodeNames"] == ["gpu", "npu", "dcu"]  # a pod asking nothing we schedule passes through
        assert VGPU_NODE not in pod_annotations(emulator, "a")
    assert node_annotations(emulator, "npu")[ascend.handshake_key(B3)].startswith("Reported_")
