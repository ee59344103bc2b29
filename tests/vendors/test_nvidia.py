"""NVIDIA as a device family: the port's answers are NVIDIA's wire formats and request rules, unchanged."""

from __future__ import annotations

import pytest

from hami_common.annotations import (
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_REGISTER,
    NVIDIA_VENDOR,
    ContainerDevice,
    DeviceInfo,
    encode_node_devices,
)
from hami_common.envvars import CUDA_DISABLE_CONTROL, CUDA_TASK_PRIORITY, NVIDIA_VISIBLE_DEVICES
from hami_common.errors import InvalidInput
from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY, ContainerResources, ResourceConfig
from hami_common.scheduling import NodeUsage, device_usage_from
from hami_common.vendors import DeviceFamily, NodeView, device_families
from hami_common.vendors.hygon import HygonFamily
from hami_common.vendors.nvidia import NvidiaFamily

NVIDIA: DeviceFamily = NvidiaFamily()  # typed as the port: mypy --strict checks that it implements it


def test_the_default_family_comes_first_and_carries_the_configured_names() -> None:
    renamed = ResourceConfig(count_name="example.com/vgpu", memory_name="example.com/vmem")
    hygon = HygonFamily()
    first, second = device_families(renamed, (hygon,))
    assert (first.word, second) == (NVIDIA_VENDOR, hygon)
    assert first.resource_names[:2] == ("example.com/vgpu", "example.com/vmem")
    assert first.quota.memory_name == "example.com/vmem"


def test_the_request_reads_the_configured_names_and_memory_factor() -> None:
    family = NvidiaFamily(ResourceConfig(count_name="example.com/vgpu", memory_factor=2, default_cores=5))
    asked = family.request(ContainerResources("main", {"example.com/vgpu": "2", GPU_MEMORY: "1000"}))
    assert asked is not None
    assert (asked.nums, asked.memreq, asked.coresreq) == (2, 2000, 5)  # MiB times the factor; default cores
    assert family.request(ContainerResources("main", {GPU: "1"})) is None  # not the configured count name
    with pytest.raises(InvalidInput, match=r"example\.com/vgpu"):
        family.request(ContainerResources("main", {"example.com/vgpu": "1.5"}))


def test_node_devices_are_the_register_annotation() -> None:
    cards = (
        DeviceInfo(id="GPU-a", index=0, count=10, devmem=16384, devcore=100, type="NVIDIA-Tesla T4", numa=0),
        DeviceInfo(id="GPU-b", index=1, count=10, devmem=16384, devcore=100, type="NVIDIA-Tesla T4", numa=1),
    )
    node = NodeView("n1", annotations={NODE_REGISTER: encode_node_devices(cards)})
    assert NVIDIA.node_devices(node) == tuple(device_usage_from(c) for c in cards)
    assert NVIDIA.node_devices(NodeView("n2")) == ()


def test_a_placement_writes_and_reads_back_hamis_device_lists() -> None:
    picked = ((ContainerDevice(uuid="GPU-a", type=NVIDIA_VENDOR, usedmem=3000, usedcores=30),), ())
    written = NVIDIA.pod_annotations(NodeUsage(name="n1", devices=()), picked, {})
    assert written == {DEVICES_TO_ALLOCATE: "GPU-a,NVIDIA,3000,30:;;", DEVICES_ALLOCATED: "GPU-a,NVIDIA,3000,30:;;"}
    # HAMi's list ends every container with ";" and so decodes one empty entry past the last container
    assert NVIDIA.allocated(written)[:2] == picked
    # the device plugin's copy alone (the allocated one not yet written) still counts
    assert NVIDIA.allocated({DEVICES_TO_ALLOCATE: written[DEVICES_TO_ALLOCATE]})[:2] == picked
    assert NVIDIA.pod_annotations(NodeUsage(name="n1", devices=()), ((), ()), {}) == {}
    assert {DEVICES_TO_ALLOCATE, DEVICES_ALLOCATED} <= NVIDIA.owned_annotations


def test_admission_is_hamis_mutation() -> None:
    family = NvidiaFamily(overwrite_env=True, runtime_class_name="nvidia")
    memory_only = family.admit(ContainerResources("a", {GPU_MEMORY: "3000", "nvidia.com/priority": "1"}), {})
    assert (memory_only.asks, dict(memory_only.limits)) == (
        True,
        {GPU_MEMORY: "3000", "nvidia.com/priority": "1", GPU: "1"},
    )
    assert memory_only.env == {CUDA_TASK_PRIORITY: "1"}
    assert (memory_only.runtime_class, memory_only.guarded_env) == ("nvidia", (CUDA_DISABLE_CONTROL,))
    whole = family.admit(ContainerResources("b", {GPU: "1"}), {})
    assert dict(whole.limits) == {GPU: "1", GPU_CORES: "100"}  # exclusive by default
    none = family.admit(ContainerResources("log"), {})
    assert (none.asks, none.env, none.guarded_env) == (False, {NVIDIA_VISIBLE_DEVICES: "none"}, ())
    with pytest.raises(InvalidInput, match="must be an integer between 0 and 100"):
        family.admit(ContainerResources("c", {GPU: "1", "nvidia.com/gpumem-percentage": "150"}), {})


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({GPU: "1", GPU_CORES: "150"}, "from 0 to 100"),
        ({GPU: "1", GPU_MEMORY: "3Gi"}, "from 0 to 2147483647"),
        ({GPU: "-1"}, "it is negative"),
    ],
)
def test_check_refuses_what_the_request_fields_cannot_hold(limits: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        NVIDIA.check(ContainerResources("main", limits))
