"""The ResourceSlices a node publishes in DRA mode (hami_common.dra.slices), against spec dra.md's facts about
HAMi's kubelet plugin; the real apiserver's validation judges them in tests/realk8s/test_dra_allocation.py."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from hami_common.annotations.registration import MigProfile
from hami_common.dra.slices import MIB, node_slices, published_gpus, slice_devices, slice_name
from hami_common.errors import InvalidInput
from hami_common.inventory import MODE_MIG, Gpu, NodeDeviceConfig

A100 = Gpu(uuid="GPU-a100-0", index=0, model="NVIDIA A100-SXM4-40GB", memory_mib=40960, numa=1, bus_id="0000:3b:00.0")


def _wire(devices_of: tuple[Gpu, ...], config: NodeDeviceConfig | None = None, **kwargs: Any) -> list[Any]:
    devices = slice_devices(devices_of, config or NodeDeviceConfig())
    return [msgspec.json.decode(msgspec.json.encode(s)) for s in node_slices("node-a", devices, generation=1, **kwargs)]


def test_one_gpu_is_one_shareable_device_with_hami_dras_names_and_capacities() -> None:
    [body] = _wire((A100,), node_uid="uid-1")
    assert body == {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": "node-a-hami-core-gpu.project-hami.io-0",
            "labels": {"hami.io/dra-slice": "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1"}],
        },
        "spec": {
            "driver": "hami-core-gpu.project-hami.io",
            "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "node-a",
            "devices": [
                {
                    "name": "hami-gpu-0",
                    "attributes": {
                        "type": {"string": "hami-gpu"},
                        "uuid": {"string": "GPU-a100-0"},
                        "productName": {"string": "NVIDIA A100-SXM4-40GB"},
                        "index": {"int": 0},
                        "resource.kubernetes.io/numaNode": {"int": 1},
                        "pcieBusID": {"string": "0000:3b:00.0"},
                    },
                    "capacity": {
                        "cores": {
                            "value": "100",
                            "requestPolicy": {"default": "100", "validRange": {"min": "0", "step": "1"}},
                        },
                        "memory": {
                            "value": str(40960 * MIB),
                            "requestPolicy": {
                                "default": str(40960 * MIB),
                                "validRange": {"min": str(MIB), "step": str(MIB)},
                            },
                        },
                    },
                    "allowMultipleAllocations": True,
                }
            ],
        },
    }


def test_scaling_is_applied_as_registration_applies_it() -> None:
    config = NodeDeviceConfig(memory_scaling=1.5, core_scaling=2.0)
    [body] = _wire((A100,), config)
    capacity = body["spec"]["devices"][0]["capacity"]
    assert capacity["memory"]["value"] == str(61440 * MIB)
    assert capacity["cores"]["value"] == "200"


def test_a_gpu_with_no_known_memory_takes_the_preconfigured_size() -> None:
    unknown = Gpu(uuid="GPU-x", index=0, model="Tesla T4", memory_mib=0)
    assert published_gpus((unknown,), NodeDeviceConfig()) == ()
    [body] = _wire((unknown,), NodeDeviceConfig(preconfigured_memory_mib=15000))
    assert body["spec"]["devices"][0]["capacity"]["memory"]["value"] == str(15000 * MIB)


def test_filtered_unhealthy_mig_and_other_vendors_gpus_are_not_published() -> None:
    gpus = (
        Gpu(uuid="GPU-0", index=0, model="A10", memory_mib=24000),
        Gpu(uuid="GPU-1", index=1, model="A10", memory_mib=24000, healthy=False),
        Gpu(uuid="GPU-2", index=2, model="A10", memory_mib=24000),
        Gpu(uuid="GPU-3", index=3, model="A100", memory_mib=40960, mig_profiles=(MigProfile(name="1g.5gb"),)),
        Gpu(uuid="NPU-4", index=4, model="910B", memory_mib=65536, vendor="ascend"),
        Gpu(uuid="GPU-5", index=5, model="A10", memory_mib=24000),
    )
    config = NodeDeviceConfig(mode=MODE_MIG, filter_uuids=frozenset({"GPU-2"}), filter_indices=frozenset({5}))
    assert [d.name for d in slice_devices(gpus, config)] == ["hami-gpu-0"]
    # on a hami-core node a GPU reporting MIG profiles is still shared whole
    assert [d.name for d in slice_devices(gpus[3:4], NodeDeviceConfig())] == ["hami-gpu-3"]


def test_devices_are_ordered_by_index_so_an_unchanged_node_builds_equal_devices() -> None:
    one = Gpu(uuid="GPU-1", index=1, model="A10", memory_mib=24000)
    zero = Gpu(uuid="GPU-0", index=0, model="A10", memory_mib=24000)
    assert slice_devices((one, zero), NodeDeviceConfig()) == slice_devices((zero, one), NodeDeviceConfig())
    assert [d.name for d in slice_devices((one, zero), NodeDeviceConfig())] == ["hami-gpu-0", "hami-gpu-1"]


def test_more_than_128_devices_are_split_into_slices_of_one_pool_that_counts_them() -> None:
    gpus = tuple(Gpu(uuid=f"GPU-{i}", index=i, model="A10", memory_mib=24000) for i in range(130))
    slices = node_slices("n", slice_devices(gpus, NodeDeviceConfig()), generation=7)
    assert [len(s.spec.devices) for s in slices] == [128, 2]
    assert {(s.spec.pool.name, s.spec.pool.generation, s.spec.pool.resource_slice_count) for s in slices} == {
        ("n", 7, 2)
    }
    assert [s.metadata.name for s in slices] == [slice_name("n", 0), slice_name("n", 1)]


def test_a_node_without_gpus_has_no_slice_and_no_owner_without_a_uid() -> None:
    assert node_slices("n", (), generation=1) == ()
    [body] = _wire((A100,))
    assert "ownerReferences" not in body["metadata"]


def test_a_generation_below_one_or_an_overlong_node_name_is_refused() -> None:
    with pytest.raises(InvalidInput):
        node_slices("n", (), generation=0)
    with pytest.raises(InvalidInput, match="too long"):
        slice_name("n" * 240, 0)
