"""A node's GPUs as ``resource.k8s.io/v1`` ResourceSlices, in the shape HAMi's kubelet plugin publishes (pure).

HAMi's plugin (Project-HAMi/k8s-dra-driver, driver ``hami-core-gpu.project-hami.io``; spec dra.md §1.2)
publishes one device ``hami-gpu-<minor>`` per GPU with ``allowMultipleAllocations: true`` and two consumable
capacities: ``cores`` (percent, default the whole card) and ``memory`` (bytes, min and step 1Mi, default the
whole card). So the claims the webhook writes (:mod:`hami_common.dra.translate`) are allocated here exactly as
there, and kube-scheduler shares a card between pods up to its memory and never over it.

What a GPU offers is what registration offers in extender mode (hami_nodeagent.registration): the same
``filterdevices``, ``deviceMemoryScaling`` (memory may be overcommitted) and ``deviceCoreScaling``, so switching
a cluster's mode does not change how much a card holds. ``deviceSplitCount`` has no DRA counterpart (consumable
capacity has no per-device claim limit) and is not applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from hami_common.annotations.dra import DRA_SLICE_LABEL
from hami_common.dra.names import (
    ATTR_INDEX,
    ATTR_NUMA_NODE,
    ATTR_PCIE_BUS_ID,
    ATTR_PRODUCT_NAME,
    ATTR_TYPE,
    ATTR_UUID,
    CAPACITY_CORES,
    CAPACITY_MEMORY,
    DEVICE_PREFIX,
    DEVICE_TYPE,
    DRIVER,
    MAX_SLICE_DEVICES,
)
from hami_common.dra.objects import (
    CapacityRange,
    CapacityRequestPolicy,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    ResourcePool,
    ResourceSlice,
    ResourceSliceSpec,
    SliceMeta,
    SliceOwner,
)
from hami_common.errors import InvalidInput
from hami_common.inventory import MODE_MIG, Gpu, NodeDeviceConfig

__all__ = [
    "MIB",
    "SLICE_LABEL",
    "gpu_capacity",
    "node_slices",
    "published_gpus",
    "slice_devices",
    "slice_name",
]

MIB: Final = 1 << 20
_CORE_UNIT: Final = 100  # a whole card's cores, in percent
_MAX_NAME: Final = 253  # a ResourceSlice's name is a DNS subdomain
SLICE_LABEL: Final = DRA_SLICE_LABEL


def gpu_capacity(gpu: Gpu, config: NodeDeviceConfig) -> tuple[int, int]:
    """(memory in bytes, cores in percent) of one GPU, as registration computes devmem and devcore."""
    memory_mib = gpu.memory_mib or config.preconfigured_memory_mib
    if config.memory_scaling != 1:
        memory_mib = int(memory_mib * config.memory_scaling)
    return memory_mib * MIB, int(config.core_scaling * _CORE_UNIT)


def published_gpus(gpus: Sequence[Gpu], config: NodeDeviceConfig) -> tuple[Gpu, ...]:
    """The GPUs a node publishes: NVIDIA, not filtered out, healthy, with a known memory size, and not cut into
    MIG instances (HAMi's plugin serves HAMi-core sharing only). An unhealthy GPU leaves the pool, so no new
    claim lands on it; claims already allocated on it are the kubelet plugin's to fail."""
    return tuple(
        gpu
        for gpu in gpus
        if gpu.is_nvidia
        and config.registers(gpu.uuid, gpu.index)
        and gpu.healthy
        and not (config.mode == MODE_MIG and gpu.mig)
        and gpu_capacity(gpu, config)[0] > 0  # memory unknown (no NVML figure, none preconfigured)
    )


def _device(gpu: Gpu, config: NodeDeviceConfig) -> Device:
    memory, cores = gpu_capacity(gpu, config)
    attributes = {
        ATTR_TYPE: DeviceAttribute(string=DEVICE_TYPE),
        ATTR_UUID: DeviceAttribute(string=gpu.uuid),
        ATTR_PRODUCT_NAME: DeviceAttribute(string=gpu.model),
        ATTR_INDEX: DeviceAttribute(int_=gpu.index),
        # Kubernetes' standard NUMA attribute (KEP-6072): the webhook's numa-bind claims match on it. HAMi's
        # plugin does not publish it; sysfs's -1 (no NUMA) is reported as node 0, as registration does.
        ATTR_NUMA_NODE: DeviceAttribute(int_=max(gpu.numa, 0)),
    }
    if gpu.bus_id:
        attributes[ATTR_PCIE_BUS_ID] = DeviceAttribute(string=gpu.bus_id)
    capacity = {
        # a claim that names no cores takes the whole card, as HAMi's plugin; the webhook always names them,
        # and min 0 lets "cores: 0" (extender mode's shared cores) consume none
        CAPACITY_CORES: DeviceCapacity(
            value=str(cores),
            request_policy=CapacityRequestPolicy(default=str(cores), valid_range=CapacityRange(min="0", step="1")),
        ),
        # a claim that names no memory takes the whole card; a request is rounded up to whole MiB
        CAPACITY_MEMORY: DeviceCapacity(
            value=str(memory),
            request_policy=CapacityRequestPolicy(
                default=str(memory), valid_range=CapacityRange(min=str(MIB), step=str(MIB))
            ),
        ),
    }
    return Device(
        name=f"{DEVICE_PREFIX}{gpu.index}",
        attributes=attributes,
        capacity=capacity,
        allow_multiple_allocations=True,
    )


def slice_devices(gpus: Sequence[Gpu], config: NodeDeviceConfig) -> tuple[Device, ...]:
    """The devices of the node's pool, ordered by index (so an unchanged node gives equal tuples)."""
    return tuple(_device(gpu, config) for gpu in sorted(published_gpus(gpus, config), key=lambda g: g.index))


def slice_name(node: str, number: int) -> str:
    """The ``number``-th slice of ``node``: fixed names, so a publisher replaces its slices in place."""
    name = f"{node}-{DRIVER}-{number}"
    if len(name) > _MAX_NAME:
        raise InvalidInput(f"node name {node!r} is too long for a ResourceSlice name ({len(name)} > {_MAX_NAME})")
    return name


def node_slices(
    node: str, devices: Sequence[Device], *, generation: int, node_uid: str = ""
) -> tuple[ResourceSlice, ...]:
    """The pool ``node`` (one per node, named after it as HAMi's plugin names it) as slices of at most 128
    devices, every one stamped with ``generation`` and the count; none for a node without devices.

    ``node_uid`` makes the Node the owner, so a deleted Node takes its slices with it.
    """
    if generation < 1:
        raise InvalidInput(f"a pool's generation starts at 1, not {generation}")
    chunks = [tuple(devices[i : i + MAX_SLICE_DEVICES]) for i in range(0, len(devices), MAX_SLICE_DEVICES)]
    owners = (SliceOwner(api_version="v1", kind="Node", name=node, uid=node_uid),) if node_uid else ()
    pool = ResourcePool(name=node, generation=generation, resource_slice_count=len(chunks))
    return tuple(
        ResourceSlice(
            metadata=SliceMeta(name=slice_name(node, number), labels={SLICE_LABEL: "true"}, owner_references=owners),
            spec=ResourceSliceSpec(driver=DRIVER, pool=pool, node_name=node, devices=chunk),
        )
        for number, chunk in enumerate(chunks)
    )
