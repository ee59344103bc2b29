"""NVIDIA as one device family (hami-protocol §1-§4): the ``nvidia:`` knobs of HAMi's device config behind the
same port every other family implements (:class:`~hami_common.vendors.DeviceFamily`).

The pieces are the ones the services used on NVIDIA's own path: the request parsing of
:mod:`hami_common.resources`, the Fit of :mod:`hami_common.scheduling.nvidia` (MIG is one of its modes: a
card's ``mode`` and ``nvidia.com/vgpu-mode`` choose), the ``hami.io/node-nvidia-register`` codec and the
``hami.io/vgpu-*`` device lists. Nothing here is new behaviour; it is NVIDIA's behaviour with one address.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from hami_common.annotations import ContainerDevice, decode_node_devices, decode_pod_devices
from hami_common.annotations.keys import (
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    MIG_ALLOCATIONS,
    NODE_HANDSHAKE,
    NODE_LOCK,
    NODE_REGISTER,
    NVIDIA_VENDOR,
    USER_POD_ANNOTATIONS,
)
from hami_common.envvars import (
    CUDA_DISABLE_CONTROL,
    CUDA_TASK_PRIORITY,
    GPU_CORE_UTILIZATION_POLICY,
    NVIDIA_VISIBLE_DEVICES,
)
from hami_common.quantity import value
from hami_common.resources import (
    INT32_MAX,
    MAX_CORES,
    ContainerResources,
    DeviceRequest,
    ResourceConfig,
    checked_whole,
    container_request,
    is_exclusive,
    needs_default_gpu_num,
    validate_percentage,
)
from hami_common.scheduling.nvidia import NVIDIA
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.usage import DeviceUsage, NodeUsage, device_usage_from
from hami_common.scheduling.vendor import ContainerFit, FitContext
from hami_common.vendors._common import SHARED_LOCK_EXPIRY, device_lists
from hami_common.vendors._family import Admission, NodeLockSpec, NodeView, QuotaSpec

__all__ = ["DEFAULT_CORE_POLICY", "DEVICE_LISTS", "EXCLUSIVE_CORES", "VISIBLE_NONE", "NvidiaFamily"]

DEFAULT_CORE_POLICY: Final = "default"
VISIBLE_NONE: Final = "none"  # NVIDIA_VISIBLE_DEVICES for a container without a GPU (overwriteEnv)
EXCLUSIVE_CORES: Final = "100"
# NVIDIA's device list: the allocated copy, else the to-allocate one the device plugin consumes.
DEVICE_LISTS: Final = (DEVICES_ALLOCATED, DEVICES_TO_ALLOCATE)


@dataclass(frozen=True, slots=True)
class NvidiaFamily:
    """The NVIDIA backend, common word ``NVIDIA``; cards register as ``NVIDIA-<model>`` (any case).

    ``config`` holds the resource names and request defaults; the other fields are the webhook's
    ``nvidia:`` knobs (``gpuCorePolicy``, ``overwriteEnv``, ``runtimeClassName``), which only
    :meth:`admit` reads.
    """

    config: ResourceConfig = field(default_factory=ResourceConfig)
    gpu_core_policy: str = DEFAULT_CORE_POLICY
    overwrite_env: bool = False
    runtime_class_name: str = ""
    word: str = NVIDIA_VENDOR

    @property
    def resource_names(self) -> tuple[str, ...]:
        c = self.config
        return (c.count_name, c.memory_name, c.memory_percentage_name, c.core_name, c.priority_name)

    @property
    def handshake_key(self) -> str | None:
        return NODE_HANDSHAKE

    @property
    def register_key(self) -> str | None:
        return NODE_REGISTER

    @property
    def node_lock(self) -> NodeLockSpec:
        return NodeLockSpec(key=NODE_LOCK, expiry=SHARED_LOCK_EXPIRY, shared=True, bus_placed=True)

    @property
    def quota(self) -> QuotaSpec:
        c = self.config
        return QuotaSpec(memory_name=c.memory_name, core_name=c.core_name, memory_factor=c.memory_factor)

    def owns(self, dev: DeviceUsage) -> bool:
        return NVIDIA.owns(dev)

    def fit(self, devices: Sequence[DeviceUsage], request: DeviceRequest, ctx: FitContext) -> ContainerFit:
        return NVIDIA.fit(devices, request, ctx)

    def preferences(self, base: PodPreferences, pod_annotations: Mapping[str, str]) -> PodPreferences:
        """HAMi's generic policy annotations are NVIDIA's own (``nvidia.com/use-gputype`` and the rest)."""
        return base

    def check(self, container: ContainerResources) -> None:
        """Every managed quantity, in limits and in requests, a whole number HAMi's int32 fields hold
        (``gpucores`` at most 100: a percentage of one card), and memory still in range once times
        memoryFactor; InvalidInput naming the resource and the range."""
        c = self.config
        for name in (c.count_name, c.memory_name, c.core_name, c.priority_name):
            for source in (container.limits, container.requests):
                text = source.get(name)
                if text is not None:
                    checked_whole(container.name, name, text, high=MAX_CORES if name == c.core_name else INT32_MAX)
        if c.memory_factor > 1:  # memory past int32 once scaled, as the scheduler reads it
            container_request(container, c)

    def admit(self, container: ContainerResources, pod_annotations: Mapping[str, str]) -> Admission:
        """HAMi's NVIDIA ``MutateAdmission`` (hami-protocol §3): the percentage check (InvalidInput),
        ``CUDA_TASK_PRIORITY``, ``GPU_CORE_UTILIZATION_POLICY``, defaultGPUNum, exclusive-by-default cores,
        ``NVIDIA_VISIBLE_DEVICES=none`` for a container without a GPU (overwriteEnv)."""
        c = self.config
        validate_percentage(container, c)
        env: dict[str, str] = {}
        priority = container.limits.get(c.priority_name)
        if priority is not None:
            env[CUDA_TASK_PRIORITY] = str(value(priority))
        if self.gpu_core_policy not in ("", DEFAULT_CORE_POLICY):
            env[GPU_CORE_UTILIZATION_POLICY] = self.gpu_core_policy
        limits = container.limits
        asks = c.count_name in limits
        if not asks and needs_default_gpu_num(container, c):
            limits = {**limits, c.count_name: str(c.default_gpu_num)}
            asks = True
        if is_exclusive(ContainerResources(container.name, limits, container.requests), c):
            # the count may be in requests alone: the container asks for a GPU all the same
            limits = {**limits, c.core_name: EXCLUSIVE_CORES}
            asks = True
        if not asks and self.overwrite_env:
            env[NVIDIA_VISIBLE_DEVICES] = VISIBLE_NONE
        return Admission(
            asks=asks,
            limits=limits,
            requests=container.requests,
            env=env,
            runtime_class=self.runtime_class_name or None,
            guarded_env=(CUDA_DISABLE_CONTROL,) if asks else (),
        )

    def request(self, container: ContainerResources) -> DeviceRequest | None:
        return container_request(container, self.config)

    def node_devices(self, node: NodeView) -> tuple[DeviceUsage, ...]:
        value_ = node.annotations.get(NODE_REGISTER)
        return tuple(device_usage_from(d) for d in decode_node_devices(value_)) if value_ else ()

    def score_node(self, node: NodeUsage, picked: Sequence[Sequence[ContainerDevice]]) -> float:
        return 0.0

    def pod_annotations(
        self, node: NodeUsage, picked: Sequence[Sequence[ContainerDevice]], pod_annotations: Mapping[str, str]
    ) -> Mapping[str, str]:
        if not any(picked):
            return {}
        return device_lists(picked, DEVICES_TO_ALLOCATE, DEVICES_ALLOCATED)

    @property
    def owned_annotations(self) -> frozenset[str]:
        return frozenset({DEVICES_TO_ALLOCATE, DEVICES_ALLOCATED, MIG_ALLOCATIONS})

    @property
    def user_annotations(self) -> frozenset[str]:
        return USER_POD_ANNOTATIONS

    def allocated(self, pod_annotations: Mapping[str, str]) -> tuple[tuple[ContainerDevice, ...], ...]:
        key = next((k for k in DEVICE_LISTS if pod_annotations.get(k)), None)
        return () if key is None else decode_pod_devices(pod_annotations[key], key)
