"""Other vendors' Allocate, as their device plugins answer it, for declared devices (hami-vendors §1.7, §2.6,
§3.5): the pure answer of each family, and the allocator's record of it (erased entry, bind-phase, locks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import msgspec
import pytest

from hami_allocator.pending import PendingPod
from hami_allocator.vendors import VendorNode, erase_keys, settled
from hami_common.annotations import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    VGPU_NODE,
    decode_pod_devices,
)
from hami_common.annotations.nodelock import NodeLock, encode_node_lock
from hami_common.deviceconfig import parse_device_config
from hami_common.errors import InvalidInput, NotFound
from hami_common.inventory import Gpu
from hami_common.kube import AnnotationChanges, Node, ObjectMeta, Pod
from hami_common.resources import ContainerResources
from hami_common.vendors.plugin import AllocateCall, PendingView, VendorPlugin, plugins

NODE = "mixed-node"
ASCEND_LIST = "hami.io/Ascend910B3-devices-to-allocate"
ASCEND_RUNTIME = "huawei.com/Ascend910B3"
DCU_LIST = "hami.io/dcu-devices-to-allocate"
PLUGINS = plugins(parse_device_config("vnpus: {enabled: true}\ncambricon: {}\nhygon: {}\n").families)


def _plugin(word: str) -> VendorPlugin:
    return next(p for p in PLUGINS if p.family.word == word)


def _pod(
    annotations: Mapping[str, str],
    limits: Mapping[str, str] | None = None,
    *,
    uid: str = "uid-1",
    bind_time: int = 100,
    containers: Sequence[str] = ("main",),
) -> PendingView:
    base = {VGPU_NODE: NODE, BIND_TIME: str(bind_time), BIND_PHASE: "allocating"}
    return PendingView(
        uid=uid,
        namespace="default",
        name=f"pod-{uid}",
        phase="Pending",
        annotations={**base, **annotations},
        containers=tuple(ContainerResources(name=c, limits=dict(limits or {})) for c in containers),
    )


NPUS = tuple(Gpu(uuid=f"die-{i}", index=i, model="Ascend910B3", memory_mib=65536, vendor="ascend") for i in range(6))
DCUS = (
    Gpu(uuid="DCU-1", index=0, model="K100_AI", memory_mib=65520, vendor="hygon"),
    Gpu(uuid="DCU-2", index=1, model="K100_AI", memory_mib=65520, vendor="hygon"),
)
MLUS = tuple(Gpu(uuid=f"MLU-{i}", index=i, model="MLU370", memory_mib=49152, vendor="cambricon") for i in range(2))


def _call(resource: str, pods: Sequence[PendingView], gpus: Sequence[Gpu], ids: int = 1, **kw: object) -> AllocateCall:
    return AllocateCall(
        node=NODE,
        resource=resource,
        device_ids=tuple(f"id-{i}" for i in range(ids)),
        pods=pods,
        gpus=gpus,
        **kw,  # type: ignore[arg-type]
    )


# --- Ascend ---------------------------------------------------------------------------------------------------


def test_ascend_hard_split_answers_the_physical_id_and_the_template() -> None:
    pod = _pod(
        {
            ASCEND_LIST: "die-4,Ascend910B3,16384,0:;",
            ASCEND_RUNTIME: '[{"UUID":"die-4","temp":"vir05_1c_16g","memory":16384}]',
        }
    )
    answer = _plugin("Ascend910B3").allocate(_call("huawei.com/Ascend910B3", [pod], NPUS))
    assert answer.response.envs == {"ASCEND_VISIBLE_DEVICES": "4", "ASCEND_VNPU_SPECS": "vir05_1c_16g"}
    assert not any(decode_pod_devices(answer.pod_changes[ASCEND_LIST]))  # the entry is erased
    assert answer.settles_bind


def test_ascend_whole_cards_get_no_template_and_every_physical_id_in_order() -> None:
    pod = _pod(
        {
            ASCEND_LIST: "die-5,Ascend910B3,65536,0:die-1,Ascend910B3,65536,0:;",
            ASCEND_RUNTIME: '[{"UUID":"die-5","memory":65536},{"UUID":"die-1","memory":65536}]',
        }
    )
    answer = _plugin("Ascend910B3").allocate(_call("huawei.com/Ascend910B3", [pod], NPUS, ids=2))
    assert answer.response.envs == {"ASCEND_VISIBLE_DEVICES": "5,1"}


def test_ascend_hami_core_answers_the_npu_quota_and_shared_regions() -> None:
    pod = _pod(
        {
            "huawei.com/vnpu-mode": "hami-core",
            ASCEND_LIST: "die-2,Ascend910B3,28672,40:;",
            ASCEND_RUNTIME: '[{"UUID":"die-2","memory":28672,"core":40}]',
        }
    )
    answer = _plugin("Ascend910B3").allocate(_call("huawei.com/Ascend910B3", [pod], NPUS))
    env = answer.response.envs
    assert env["NPU_MEM_QUOTA"] == "28672"
    assert env["NPU_PRIORITY"] == "40"
    assert env["NPU_GLOBAL_SHM_PATH"] == "/hami-shared-region/2_global_registry"
    assert "ASCEND_VNPU_SPECS" not in env
    assert ("/etc/ld.so.preload", True) in {(m.container_path, m.read_only) for m in answer.response.mounts}


def test_ascend_refuses_a_device_count_kubelet_did_not_ask_for() -> None:
    pod = _pod({ASCEND_LIST: "die-4,Ascend910B3,16384,0:;", ASCEND_RUNTIME: "[]"})
    with pytest.raises(InvalidInput, match="device number not matched"):
        _plugin("Ascend910B3").allocate(_call("huawei.com/Ascend910B3", [pod], NPUS, ids=2))


def test_ascend_finds_no_pod_when_none_is_binding_here() -> None:
    elsewhere = _pod({ASCEND_LIST: "die-4,Ascend910B3,16384,0:;", VGPU_NODE: "other-node"})
    with pytest.raises(NotFound, match="no binding pod"):
        _plugin("Ascend910B3").allocate(_call("huawei.com/Ascend910B3", [elsewhere], NPUS))


def test_ascend_serves_the_oldest_binding_pod_first() -> None:
    young = _pod({ASCEND_LIST: "die-0,Ascend910B3,16384,0:;", ASCEND_RUNTIME: "[]"}, uid="young", bind_time=200)
    old = _pod({ASCEND_LIST: "die-3,Ascend910B3,16384,0:;", ASCEND_RUNTIME: "[]"}, uid="old", bind_time=100)
    answer = _plugin("Ascend910B3").allocate(_call("huawei.com/Ascend910B3", [young, old], NPUS))
    assert (answer.pod.uid, answer.response.envs["ASCEND_VISIBLE_DEVICES"]) == ("old", "3")


# --- Hygon ------------------------------------------------------------------------------------------------------


def test_hygon_vdcu_gets_its_drm_nodes_and_a_vdev_conf() -> None:
    pod = _pod({DCU_LIST: "DCU-2,DCU,8000,30:;"})
    answer = _plugin("DCU").allocate(_call("hygon.com/dcunum", [pod], DCUS))
    paths = [d.container_path for d in answer.response.devices]
    assert paths == ["/dev/kfd", "/dev/mkfd", "/dev/dri/card1", "/dev/dri/renderD129"]
    mounts = {m.container_path for m in answer.response.mounts}
    assert mounts == {"/etc/vdev/docker/", "/opt/hygondriver", "/opt/hyhal"}
    assert answer.response.envs == {}  # dcu-dp sets no env vars
    conf = answer.files[0]
    assert conf.path.endswith("/uid-1_main_1_0_0_0xffffffff_0xffffffff/vdev0.conf")
    assert "mem: 8000 MiB" in conf.text
    assert "cu_count: 19" in conf.text  # 30 % of 64 compute units
    assert not any(decode_pod_devices(answer.pod_changes[DCU_LIST]))


def test_hygon_whole_card_is_passed_through_without_a_vdcu() -> None:
    pod = _pod({DCU_LIST: "DCU-1,DCU,65520,100:;"})
    answer = _plugin("DCU").allocate(_call("hygon.com/dcunum", [pod], DCUS))
    assert {m.container_path for m in answer.response.mounts} == {"/opt/hyhal"}
    assert answer.files == ()


def test_hygon_erases_one_container_entry_per_call() -> None:
    pod = _pod({DCU_LIST: "DCU-1,DCU,2000,10:;DCU-2,DCU,2000,10:;"}, containers=("first", "second"))
    answer = _plugin("DCU").allocate(_call("hygon.com/dcunum", [pod], DCUS))
    assert answer.container == "first"
    assert [[d.uuid for d in c] for c in decode_pod_devices(answer.pod_changes[DCU_LIST])][:2] == [[], ["DCU-2"]]


# --- Cambricon ----------------------------------------------------------------------------------------------------

SMLU = {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vcore": "10", "cambricon.com/mlu.smlu.vmemory": "20"}


def _smlu_pod(**extra: str) -> PendingView:
    return _pod({"CAMBRICON_DSMLU_PROFILE": "1_10_20", "CAMBRICON_DSMLU_ASSIGHED": "false", **extra}, SMLU)


def test_cambricon_first_call_answers_the_smlu_devices_and_changes_nothing_yet() -> None:
    answer = _plugin("MLU").allocate(_call("cambricon.com/mlu.smlu.vcore", [_smlu_pod()], MLUS, ids=10))
    paths = [d.container_path for d in answer.response.devices]
    assert paths[:2] == ["/dev/cambricon_dev1", "/dev/cambricon_ipcm1"]
    assert answer.pod_changes == {}
    assert answer.release_node_annotation is None
    assert not answer.settles_bind  # cambricon-dp never sets bind-phase


def test_cambricon_second_call_marks_the_pod_assigned_in_both_spellings_and_unlocks() -> None:
    pod = _smlu_pod()
    call = _call("cambricon.com/mlu.smlu.vmemory", [pod], MLUS, ids=20, served={pod.uid: frozenset(
        {"cambricon.com/mlu.smlu.vcore"})})  # fmt: skip
    answer = _plugin("MLU").allocate(call)
    assert answer.pod_changes["CAMBRICON_DSMLU_ASSIGHED"] == "true"
    assert answer.pod_changes["CAMBRICON_DSMLU_ASSIGNED"] == "true"
    assert answer.pod_changes["CAMBRICON_DSMLU_PROFILE_INSTANCE"].endswith("_1_1")
    assert answer.release_node_annotation == "cambricon.com/dsmlu.lock"


def test_cambricon_skips_a_pod_already_assigned() -> None:
    done = _pod({"CAMBRICON_DSMLU_PROFILE": "0_10_20", "CAMBRICON_DSMLU_ASSIGHED": "true"}, SMLU)
    with pytest.raises(NotFound):
        _plugin("MLU").allocate(_call("cambricon.com/mlu.smlu.vcore", [done], MLUS, ids=10))


def test_cambricon_refuses_a_malformed_profile() -> None:
    pod = _smlu_pod(CAMBRICON_DSMLU_PROFILE="one_10")
    with pytest.raises(InvalidInput, match="CAMBRICON_DSMLU_PROFILE"):
        _plugin("MLU").allocate(_call("cambricon.com/mlu.smlu.vcore", [pod], MLUS, ids=10))


# --- advertised resources, one socket each -----------------------------------------------------------------------


def test_each_family_serves_its_count_resources_on_a_socket_of_its_own() -> None:
    served = {
        p.family.word: {r: len(ids) for r, ids in p.advertised(NODE, gpus).items()}
        for p, gpus in ((_plugin("Ascend910B3"), NPUS[:2]), (_plugin("DCU"), DCUS), (_plugin("MLU"), MLUS))
    }
    assert served == {
        "Ascend910B3": {"huawei.com/Ascend910B3": 8},  # 4 slots per 910B3 (65536 / 16384)
        "DCU": {"hygon.com/dcunum": 8},  # 4 per DCU
        "MLU": {"cambricon.com/mlu.smlu.vcore": 200, "cambricon.com/mlu.smlu.vmemory": 384},
    }
    sockets = [p.socket_name(r) for p in PLUGINS for r in p.advertised(NODE, NPUS + DCUS + MLUS)]
    assert len(set(sockets)) == len(sockets)


# --- the allocator's record ----------------------------------------------------------------------------------------


@dataclass
class FakeKube:
    pods: list[PendingPod]
    node_annotations: dict[str, str] = field(default_factory=dict)
    pod_patches: list[dict[str, str | None]] = field(default_factory=list)

    async def list_node_pods(self, node: str) -> list[PendingPod]:
        return self.pods

    async def patch_pod_annotations(
        self, namespace: str, name: str, changes: AnnotationChanges, *, resource_version: str = ""
    ) -> Pod:
        self.pod_patches.append(dict(changes))
        return Pod()

    async def get_node(self, name: str) -> Node:
        return Node(metadata=ObjectMeta(name=name, annotations=dict(self.node_annotations)))

    async def patch_node_annotations(
        self, name: str, changes: AnnotationChanges, *, resource_version: str = ""
    ) -> Node:
        for key, value in changes.items():
            if value is None:
                self.node_annotations.pop(key, None)
            else:
                self.node_annotations[key] = value
        return await self.get_node(name)


def _pending(annotations: Mapping[str, str]) -> PendingPod:
    body = {
        "metadata": {"name": "pod-uid-1", "namespace": "default", "uid": "uid-1", "annotations": dict(annotations)},
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
        "status": {"phase": "Pending"},
    }
    return msgspec.convert(body, PendingPod)


def _locked() -> dict[str, str]:
    return {NODE_LOCK: encode_node_lock(NodeLock(datetime.now(UTC), "default", "pod-uid-1"))}


async def test_last_entry_settles_the_bind_and_releases_the_shared_lock() -> None:
    kube = FakeKube([_pending({VGPU_NODE: NODE, BIND_TIME: "1", BIND_PHASE: "allocating",
                               DCU_LIST: "DCU-1,DCU,65520,100:;"})], _locked())  # fmt: skip
    vendor = VendorNode(NODE, _plugin("DCU"), DCUS, kube, kube, erase_keys(PLUGINS))
    await vendor.allocate("hygon.com/dcunum", ["DCU-1-fake-0"])
    assert kube.pod_patches[-1][BIND_PHASE] == "success"
    assert NODE_LOCK not in kube.node_annotations


async def test_an_entry_of_another_vendor_left_keeps_the_bind_allocating() -> None:
    kube = FakeKube([_pending({VGPU_NODE: NODE, BIND_TIME: "1", BIND_PHASE: "allocating",
                               DCU_LIST: "DCU-1,DCU,65520,100:;",
                               DEVICES_TO_ALLOCATE: "GPU-1,NVIDIA,1000,10:;"})], _locked())  # fmt: skip
    vendor = VendorNode(NODE, _plugin("DCU"), DCUS, kube, kube, erase_keys(PLUGINS))
    await vendor.allocate("hygon.com/dcunum", ["DCU-1-fake-0"])
    assert BIND_PHASE not in kube.pod_patches[-1]
    assert NODE_LOCK in kube.node_annotations


def test_settled_reads_every_list_and_a_broken_one_is_not_settled() -> None:
    assert settled({DCU_LIST: ";", DEVICES_TO_ALLOCATE: ""}, erase_keys(PLUGINS))
    assert not settled({ASCEND_LIST: "die-1,Ascend910B3,1,0:;"}, erase_keys(PLUGINS))
    assert not settled({DCU_LIST: "x,y"}, erase_keys(PLUGINS))
