"""An allocated claim becomes HAMi-core's answer and a CDI spec (hami_common.dra.prepare). The claims here are
shaped as the apiserver returns them; tests/realk8s/test_dra_allocation.py feeds one the real kube-scheduler
allocated."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from hami_common import envvars
from hami_common.allocation import NodeAllocationConfig, build_container
from hami_common.dra.prepare import CDI_KIND, AllocatedClaim, cdi_device_id, cdi_spec, claim_grant
from hami_common.errors import InvalidInput

UID = "5f0c3f6e-3d1a-4c55-9d3e-0b6f1f4f2a10"
UUIDS = {"hami-gpu-0": "GPU-aaaa", "hami-gpu-1": "GPU-bbbb"}


def _result(device: str, memory: str = "3145728k", cores: str = "0", **over: Any) -> dict[str, Any]:
    result = {
        "request": "gpu",
        "driver": "hami-core-gpu.project-hami.io",
        "pool": "node-a",
        "device": device,
        "shareID": "9c1f0b7e-0000-4000-8000-000000000001",
        "consumedCapacity": {"memory": memory, "cores": cores},
    }
    result.update(over)
    return result


def _claim(*results: dict[str, Any], allocated: bool = True) -> AllocatedClaim:
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "infer-main-nvidia-x7k2p", "namespace": "team", "uid": UID},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": {"devices": {"results": list(results)}}} if allocated else {},
    }
    return msgspec.json.decode(msgspec.json.encode(body), type=AllocatedClaim)


def test_a_shared_card_becomes_hami_cores_limits_for_the_container() -> None:
    grant = claim_grant(_claim(_result("hami-gpu-0", cores="30")), "node-a", UUIDS)
    answer = build_container(UID, grant, NodeAllocationConfig())
    envs = answer.response.envs
    assert envs[envvars.NVIDIA_VISIBLE_DEVICES] == "GPU-aaaa"
    assert envs[envvars.memory_limit(0)] == "3000m"
    assert envs[envvars.CUDA_DEVICE_SM_LIMIT] == "30"
    assert answer.cache_dir == f"/usr/local/vgpu/containers/{UID}_gpu"  # the claim's own cache directory


def test_two_cards_get_a_memory_limit_each() -> None:
    claim = _claim(_result("hami-gpu-0", memory="1Gi"), _result("hami-gpu-1", memory="2Gi"))
    envs = build_container(UID, claim_grant(claim, "node-a", UUIDS), NodeAllocationConfig()).response.envs
    assert envs[envvars.NVIDIA_VISIBLE_DEVICES] == "GPU-aaaa,GPU-bbbb"
    assert (envs[envvars.memory_limit(0)], envs[envvars.memory_limit(1)]) == ("1024m", "2048m")


def test_another_drivers_devices_are_not_prepared_here() -> None:
    other = _result("gpu-0", driver="gpu.nvidia.com", consumedCapacity={})
    grant = claim_grant(_claim(other, _result("hami-gpu-1")), "node-a", UUIDS)
    assert [d.uuid for d in grant.devices] == ["GPU-bbbb"]
    with pytest.raises(InvalidInput, match="no device of"):
        claim_grant(_claim(other), "node-a", UUIDS)


@pytest.mark.parametrize(
    ("claim", "why"),
    [
        (_claim(allocated=False), "not allocated"),
        (_claim(_result("hami-gpu-0", pool="node-b")), "of node node-b, not of node-a"),
        (_claim(_result("hami-gpu-7")), "does not publish"),
        (_claim(_result("hami-gpu-0", consumedCapacity={})), "consumes no memory or cores"),
    ],
)
def test_a_claim_this_node_cannot_prepare_is_refused_with_why(claim: AllocatedClaim, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        claim_grant(claim, "node-a", UUIDS)


def test_the_cdi_spec_carries_the_answer_under_the_claims_uid() -> None:
    answer = build_container(UID, claim_grant(_claim(_result("hami-gpu-0")), "node-a", UUIDS), NodeAllocationConfig())
    spec = msgspec.json.decode(msgspec.json.encode(cdi_spec(UID, answer)))
    assert (spec["cdiVersion"], spec["kind"]) == ("0.6.0", "hami-core-gpu.project-hami.io/claim")
    [device] = spec["devices"]
    assert device["name"] == UID
    edits = device["containerEdits"]
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=3000m" in edits["env"]
    libvgpu = next(m for m in edits["mounts"] if m["containerPath"] == "/usr/local/vgpu/libvgpu.so")
    assert libvgpu == {
        "hostPath": "/usr/local/vgpu/libvgpu.so",
        "containerPath": "/usr/local/vgpu/libvgpu.so",
        "options": ["ro", "nosuid", "nodev", "bind"],
    }
    assert cdi_device_id(UID) == f"{CDI_KIND}={UID}"
