"""Per-container GPU requests from a pod spec, with HAMi's semantics (hami-protocol §1, §3, §9 item 6).

Pure functions over typed values: the caller decodes the pod and passes each container's limits and
requests. ``pod_request`` lists init containers first, then regular containers, as every HAMi annotation
does.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

from hami_common.annotations.keys import NVIDIA_VENDOR
from hami_common.errors import InvalidInput
from hami_common.quantity import as_int, parse_quantity

__all__ = [
    "BAD_QUANTITY",
    "GPU",
    "GPU_CORES",
    "GPU_MEMORY",
    "GPU_MEMORY_PERCENTAGE",
    "GPU_PRIORITY",
    "INT32_MAX",
    "MAX_CORES",
    "UNSET_PERCENTAGE",
    "ContainerResources",
    "DeviceRequest",
    "PodRequest",
    "RequestSource",
    "ResourceConfig",
    "checked_whole",
    "container_request",
    "is_exclusive",
    "needs_default_gpu_num",
    "pod_request",
    "validate_percentage",
]

GPU: Final = "nvidia.com/gpu"
GPU_MEMORY: Final = "nvidia.com/gpumem"
GPU_MEMORY_PERCENTAGE: Final = "nvidia.com/gpumem-percentage"
GPU_CORES: Final = "nvidia.com/gpucores"
GPU_PRIORITY: Final = "nvidia.com/priority"

UNSET_PERCENTAGE: Final = 101  # HAMi's sentinel: memory was given in MiB, not as a percentage
FULL_PERCENTAGE: Final = 100
MAX_CORES: Final = FULL_PERCENTAGE  # gpucores is a percentage of one card: more can never be honoured
INT32_MAX: Final = 2**31 - 1  # HAMi parses every request field into an int32
BAD_QUANTITY: Final = (
    "invalid {resource} value {value!r} in container {name}: {why}; it must be a whole number from 0 to {high}"
)


@dataclass(frozen=True, slots=True)
class ResourceConfig:
    """The scheduler-side ``nvidia:`` knobs of HAMi's device config, with the chart's defaults."""

    count_name: str = GPU
    memory_name: str = GPU_MEMORY
    memory_percentage_name: str = GPU_MEMORY_PERCENTAGE
    core_name: str = GPU_CORES
    priority_name: str = GPU_PRIORITY
    default_memory: int = 0  # MiB when neither memory nor percentage is asked; 0 means the whole card
    default_cores: int = 0
    default_gpu_num: int = 1
    memory_factor: int = 1


@dataclass(frozen=True, slots=True)
class ContainerResources:
    """What a container asks for: quantities as the apiserver stores them (strings)."""

    name: str
    limits: Mapping[str, str] = field(default_factory=dict)
    requests: Mapping[str, str] = field(default_factory=dict)

    def quantity(self, resource: str) -> str | None:
        """Limits win over requests, as in HAMi."""
        found = self.limits.get(resource)
        return found if found is not None else self.requests.get(resource)

    def asks_for(self, resource: str) -> bool:
        return resource in self.limits or resource in self.requests


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One container's GPU request; HAMi's ``ContainerDeviceRequest``."""

    nums: int
    memreq: int  # MiB, already multiplied by memoryFactor; 0 when given as a percentage
    mem_percentage: int  # 1..100, or UNSET_PERCENTAGE when memreq applies
    coresreq: int
    type: str = NVIDIA_VENDOR
    priority: int | None = None

    def memory_on(self, total_mib: int) -> int:
        """MiB this request takes on a card of ``total_mib`` (integer division, as HAMi's Fit)."""
        if self.memreq > 0:
            return self.memreq
        if self.mem_percentage != UNSET_PERCENTAGE:
            return total_mib * self.mem_percentage // 100
        return 0


@dataclass(frozen=True, slots=True)
class PodRequest:
    """Every container's request, init containers first; ``None`` for a container without a GPU.

    ``init`` and ``app`` are NVIDIA's requests. A container may also ask for other device families (HAMi's
    per-container map vendor -> request): ``families`` holds, per container in the same order, those
    requests (each typed by its family's common word); it is empty when no container asks any, so a pod
    that asks NVIDIA alone is the same value whether or not families are configured.
    """

    init: tuple[DeviceRequest | None, ...]
    app: tuple[DeviceRequest | None, ...]
    families: tuple[tuple[DeviceRequest, ...], ...] = ()

    @property
    def containers(self) -> tuple[DeviceRequest | None, ...]:
        """NVIDIA's request per container (the only ones that carry ``nvidia.com/priority``)."""
        return self.init + self.app

    def requests(self, index: int) -> tuple[DeviceRequest, ...]:
        """Every request of container ``index`` (init first): NVIDIA's, then each family's."""
        containers = self.containers
        own = containers[index] if index < len(containers) else None
        others = self.families[index] if index < len(self.families) else ()
        return others if own is None else (own, *others)

    @property
    def has_devices(self) -> bool:
        return any(r is not None for r in self.containers) or any(self.families)


class RequestSource(Protocol):
    """A device family's request parsing (``GenerateResourceRequests``): None when the container asks none."""

    @property
    def resource_names(self) -> tuple[str, ...]: ...

    def request(self, container: ContainerResources) -> DeviceRequest | None: ...


def _asks_any(c: ContainerResources, names: Sequence[str]) -> bool:
    return any(name in c.limits or name in c.requests for name in names)


@functools.lru_cache(maxsize=1024)  # Filter reads every pod's few distinct quantities; fractions compare slowly
def _whole_or_why(text: str, high: int, scale: int) -> int | str:
    """The whole number ``text`` holds, or why it is not one that fits (see :func:`checked_whole`)."""
    try:
        number = parse_quantity(text)
    except InvalidInput:
        return "it is not a quantity"
    if number < 0:
        return "it is negative"
    if number.denominator != 1:
        return "it is not a whole number"
    if number * scale > high:
        return "it is too large"
    return number.numerator


def checked_whole(container: str, resource: str, text: str, *, high: int = INT32_MAX, scale: int = 1) -> int:
    """A managed quantity as HAMi's int32 request field holds it.

    ``InvalidInput`` (:data:`BAD_QUANTITY`, naming the resource and the range it accepts) where it cannot
    be read: not a quantity, negative, a fraction, or past ``high`` once times ``scale`` (memoryFactor, a
    vendor's memory unit). HAMi casts such a value into its int32 or drops the request, so the pod reads as
    asking for no device; we refuse it instead, at admission and at Filter, and nothing is bound without a
    placement.
    """
    why = _whole_or_why(text, high, scale)
    if isinstance(why, int):
        return why
    raise InvalidInput(BAD_QUANTITY.format(resource=resource, value=text, name=container, why=why, high=high // scale))


def _whole(c: ContainerResources, resource: str, scale: int = 1) -> int | None:
    text = c.quantity(resource)
    return None if text is None else checked_whole(c.name, resource, text, scale=scale)


def container_request(c: ContainerResources, config: ResourceConfig) -> DeviceRequest | None:
    """HAMi's ``GenerateResourceRequests`` for one container; None when it asks for no GPU.

    A percentage at or below 0 counts as unset and one above 100 is clamped. Every quantity the container
    names is read first, asked or not: one that cannot be read (:func:`checked_whole`) is ``InvalidInput``,
    never "no GPU".
    """
    nums = _whole(c, config.count_name)
    memory = _whole(c, config.memory_name, config.memory_factor)
    percentage = _whole(c, config.memory_percentage_name)
    cores = _whole(c, config.core_name)
    priority_text = c.limits.get(config.priority_name)
    priority = None if priority_text is None else checked_whole(c.name, config.priority_name, priority_text)
    if not nums:
        return None
    memreq = 0 if memory is None else memory * config.memory_factor
    if not percentage:
        percentage = UNSET_PERCENTAGE
    elif percentage > FULL_PERCENTAGE:
        percentage = FULL_PERCENTAGE
    if percentage == UNSET_PERCENTAGE and memreq == 0:
        if config.default_memory > 0:
            memreq = config.default_memory
        else:
            percentage = FULL_PERCENTAGE
    return DeviceRequest(
        nums=nums,
        memreq=memreq,
        mem_percentage=percentage,
        coresreq=config.default_cores if cores is None else cores,
        priority=priority,
    )


def pod_request(
    init: Sequence[ContainerResources],
    app: Sequence[ContainerResources],
    config: ResourceConfig,
    families: Sequence[RequestSource] = (),
) -> PodRequest:
    """NVIDIA's request per container, plus each of ``families``' (in their order) where one is asked."""
    extra: tuple[tuple[DeviceRequest, ...], ...] = ()
    if families:
        # a family that none of a container's resources names asks nothing there: skip its parsing (quantities
        # parse slowly, and Filter does this for every pod with every configured family)
        extra = tuple(
            tuple(r for r in (f.request(c) for f in families if _asks_any(c, f.resource_names)) if r is not None)
            for c in (*init, *app)
        )
        if not any(extra):
            extra = ()
    return PodRequest(
        init=tuple(container_request(c, config) for c in init),
        app=tuple(container_request(c, config) for c in app),
        families=extra,
    )


def validate_percentage(c: ContainerResources, config: ResourceConfig) -> None:
    """The webhook's check (HAMi: pkg/device/nvidia/device.go:389-396): 0..100 in limits and requests."""
    for source in (c.limits, c.requests):
        text = source.get(config.memory_percentage_name)
        if text is None:
            continue
        try:
            number = as_int(text)
        except InvalidInput:
            number = None
        if number is None or not 0 <= number <= FULL_PERCENTAGE:
            raise InvalidInput(
                f"invalid {config.memory_percentage_name} value {text} in container {c.name}: "
                "must be an integer between 0 and 100"
            )


def needs_default_gpu_num(c: ContainerResources, config: ResourceConfig) -> bool:
    """The webhook adds ``limits[count]=defaultGPUNum`` when only memory/cores are in limits."""
    if config.count_name in c.limits or config.default_gpu_num <= 0:
        return False
    return any(name in c.limits for name in (config.core_name, config.memory_name, config.memory_percentage_name))


def is_exclusive(c: ContainerResources, config: ResourceConfig) -> bool:
    """Exclusive-by-default: the webhook sets ``gpucores: 100`` (HAMi: pkg/device/nvidia/device.go:417-450).

    Applies when the count is asked for, cores are not, and the container wants the whole card: a
    percentage of exactly 100, or neither a percentage nor MiB.
    """
    if not c.asks_for(config.count_name) or c.asks_for(config.core_name):
        return False
    percentage = c.quantity(config.memory_percentage_name)
    if percentage is not None:
        return as_int(percentage) == FULL_PERCENTAGE
    return not c.asks_for(config.memory_name)
