"""HAMi's NVIDIA request of one container, as the ResourceClaim HAMi's DRA driver serves (docs/dra.md).

Pure: a container's limits and requests, the pod's annotations and the device config's ``nvidia`` knobs go
in; a :class:`~hami_common.dra.objects.ResourceClaimSpec` comes out, or ``InvalidInput`` saying what cannot
be asked. HAMi-DRA's translation (spec dra.md §1.1) is the base: one request ``gpu`` of class
``hami-core-gpu.project-hami.io``, ``ExactCount`` of ``nvidia.com/gpu``, ``capacity.requests.memory`` in
bytes from ``nvidia.com/gpumem`` MiB, ``cores`` from ``nvidia.com/gpucores``, a CEL selector on the device
type, and ``uuid`` selectors from use/nouse-gpuuuid. Beyond it, so that a pod written for extender mode
means the same thing here:

* the request is read as HAMi's webhook and extender read it (:func:`hami_common.resources.container_request`):
  memoryFactor, defaultMemory, defaultCores, defaultGPUNum, exclusive-by-default cores;
* ``cores`` is always asked: HAMi's driver consumes its default (100, the whole card) when a claim names
  none, where HAMi shares a card's cores among pods that ask none;
* ``nvidia.com/gpumem-percentage`` 100 (or no memory at all) asks no memory: the driver's default is the
  whole card; a smaller percentage is refused, since a claim asks capacity in bytes, not in shares of a card
  it does not know yet;
* use/nouse-gputype match ``productName`` as HAMi matches a card's type: case-insensitive substrings;
* a count above one asks distinct cards (``distinctAttribute`` on ``uuid``): a consumable-capacity device can
  otherwise be allocated twice to one request; ``nvidia.com/numa-bind`` (or the ``numa`` GPU policy) and the
  ``topology-aware`` policy become ``matchAttribute`` on the standard ``numaNode`` and ``pcieRoot``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import msgspec

from hami_common.annotations.keys import (
    GPU_SCHEDULER_POLICY,
    NOUSE_GPUTYPE,
    NOUSE_GPUUUID,
    NUMA,
    NUMA_BIND,
    TOPOLOGY_AWARE,
    USE_GPUTYPE,
    USE_GPUUUID,
)
from hami_common.dra.names import (
    ATTR_NUMA_NODE,
    ATTR_PCIE_ROOT,
    ATTR_PRODUCT_NAME,
    ATTR_TYPE,
    ATTR_UUID,
    CAPACITY_CORES,
    CAPACITY_MEMORY,
    CLAIM_SUFFIX,
    DEVICE_CLASS,
    DEVICE_TYPE,
    DRIVER,
    EXACT_COUNT,
    MAX_NAME,
    REQUEST,
    TEMPLATE_PREFIX,
    qualified,
)
from hami_common.dra.objects import (
    CapacityRequirements,
    CelSelector,
    DeviceClaim,
    DeviceConstraint,
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    ResourceClaimSpec,
)
from hami_common.errors import InvalidInput
from hami_common.resources import (
    FULL_PERCENTAGE,
    MAX_CORES,
    UNSET_PERCENTAGE,
    ContainerResources,
    ResourceConfig,
    checked_whole,
    container_request,
    is_exclusive,
    needs_default_gpu_num,
    validate_percentage,
)
from hami_common.scheduling.policy import parse_bool

__all__ = [
    "BAD_ANNOTATION_VALUE",
    "PARTIAL_PERCENTAGE",
    "DraPreferences",
    "claim_entry_name",
    "claim_spec",
    "managed_names",
    "preferences",
    "template_name",
    "type_selector",
]

MIB: Final = 1024 * 1024
DIGEST_HEX: Final = 16  # 64 bits of sha256: a template name is shared only by identical specs
TRUNCATED_HEX: Final = 8
MAX_VALUE: Final = 256
# What a UUID or a product name is made of; anything else (quotes, backslashes, control characters) could
# break out of a CEL string literal, so it is refused rather than escaped.
_VALUE: Final = re.compile(r"[A-Za-z0-9 ._:/()+\-]+")

BAD_ANNOTATION_VALUE: Final = (
    "annotation {key}: {value!r} cannot name a device: a value is at most {high} letters, digits, spaces "
    "and . _ : / ( ) + -"
)
PARTIAL_PERCENTAGE: Final = (
    "container {name}: {resource} {percentage} cannot be asked in DRA mode: a ResourceClaim asks GPU memory "
    "in bytes, so ask {memory} in MiB instead (or {resource} 100 for the whole card)"
)


@dataclass(frozen=True, slots=True)
class DraPreferences:
    """What a pod's annotations ask of its cards, beyond its resources."""

    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    same_numa: bool = False
    same_pcie_root: bool = False


def _values(annotations: Mapping[str, str], key: str) -> tuple[str, ...]:
    """A comma list, trimmed, empties dropped (as HAMi's extender reads it); each value checked for CEL."""
    found = tuple(part.strip() for part in annotations.get(key, "").split(",") if part.strip())
    for value in found:
        if len(value) > MAX_VALUE or not _VALUE.fullmatch(value):
            raise InvalidInput(BAD_ANNOTATION_VALUE.format(key=key, value=value, high=MAX_VALUE))
    return found


def preferences(annotations: Mapping[str, str]) -> DraPreferences:
    """The pod's card preferences; ``InvalidInput`` names an annotation whose value cannot be a CEL literal."""
    policies = {part.strip() for part in annotations.get(GPU_SCHEDULER_POLICY, "").split(",")}
    return DraPreferences(
        use_uuids=_values(annotations, USE_GPUUUID),
        nouse_uuids=_values(annotations, NOUSE_GPUUUID),
        use_types=tuple(v.lower() for v in _values(annotations, USE_GPUTYPE)),
        nouse_types=tuple(v.lower() for v in _values(annotations, NOUSE_GPUTYPE)),
        same_numa=parse_bool(annotations.get(NUMA_BIND, "")) is True or NUMA in policies,
        same_pcie_root=TOPOLOGY_AWARE in policies,
    )


def _literals(values: tuple[str, ...]) -> str:
    # _VALUE admits no quote or backslash, so a plain double-quoted literal is exact
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def _attribute(name: str) -> str:
    return f'device.attributes["{DRIVER}"].{name}'


def type_selector() -> str:
    """HAMi-DRA's selector of HAMi-core GPUs among the driver's devices."""
    return f'{_attribute(ATTR_TYPE)} == "{DEVICE_TYPE}"'


def _selectors(prefs: DraPreferences) -> tuple[DeviceSelector, ...]:
    expressions = [type_selector()]
    if prefs.use_uuids:
        expressions.append(f"{_attribute(ATTR_UUID)} in {_literals(prefs.use_uuids)}")
    if prefs.nouse_uuids:
        expressions.append(f"!({_attribute(ATTR_UUID)} in {_literals(prefs.nouse_uuids)})")
    product = f"{_attribute(ATTR_PRODUCT_NAME)}.lowerAscii()"
    if prefs.use_types:
        expressions.append(f"{_literals(prefs.use_types)}.exists(t, {product}.contains(t))")
    if prefs.nouse_types:
        expressions.append(f"!{_literals(prefs.nouse_types)}.exists(t, {product}.contains(t))")
    return tuple(DeviceSelector(cel=CelSelector(expression=e)) for e in expressions)


def _constraints(count: int, prefs: DraPreferences) -> tuple[DeviceConstraint, ...]:
    if count < 2:  # one card agrees with itself
        return ()
    found = [DeviceConstraint(requests=(REQUEST,), distinct_attribute=qualified(ATTR_UUID))]
    if prefs.same_numa:
        found.append(DeviceConstraint(requests=(REQUEST,), match_attribute=ATTR_NUMA_NODE))
    if prefs.same_pcie_root:
        found.append(DeviceConstraint(requests=(REQUEST,), match_attribute=ATTR_PCIE_ROOT))
    return tuple(found)


def managed_names(config: ResourceConfig) -> tuple[str, ...]:
    """The NVIDIA resources the DRA mode takes off a container: nothing advertises them in DRA mode."""
    return (
        config.count_name,
        config.memory_name,
        config.memory_percentage_name,
        config.core_name,
        config.priority_name,
    )


def claim_spec(res: ContainerResources, prefs: DraPreferences, config: ResourceConfig) -> ResourceClaimSpec | None:
    """The claim of one container, or None when it asks for no NVIDIA GPU; ``InvalidInput`` where a quantity
    cannot be honoured, with the extender mode's messages (a percentage past 100, cores past 100, a quantity
    that is not a whole number in int32) or :data:`PARTIAL_PERCENTAGE`."""
    validate_percentage(res, config)
    for source in (res.limits, res.requests):
        cores = source.get(config.core_name)
        if cores is not None:
            checked_whole(res.name, config.core_name, cores, high=MAX_CORES)
    if needs_default_gpu_num(res, config):  # memory or cores alone: HAMi's webhook adds defaultGPUNum cards
        res = ContainerResources(res.name, {**res.limits, config.count_name: str(config.default_gpu_num)}, res.requests)
    request = container_request(res, config)
    if request is None:
        return None
    capacity: dict[str, str] = {}
    if request.memreq > 0:
        capacity[CAPACITY_MEMORY] = str(request.memreq * MIB)
    elif request.mem_percentage not in (FULL_PERCENTAGE, UNSET_PERCENTAGE):
        raise InvalidInput(
            PARTIAL_PERCENTAGE.format(
                name=res.name,
                resource=config.memory_percentage_name,
                percentage=request.mem_percentage,
                memory=config.memory_name,
            )
        )
    capacity[CAPACITY_CORES] = str(MAX_CORES if is_exclusive(res, config) else request.coresreq)
    exactly = ExactDeviceRequest(
        device_class_name=DEVICE_CLASS,
        allocation_mode=EXACT_COUNT,
        count=request.nums,
        selectors=_selectors(prefs),
        capacity=CapacityRequirements(requests=capacity),
    )
    return ResourceClaimSpec(
        devices=DeviceClaim(
            requests=(DeviceRequest(name=REQUEST, exactly=exactly),),
            constraints=_constraints(request.nums, prefs),
        )
    )


_SPEC_ENCODER: Final = msgspec.json.Encoder(order="deterministic")


def template_name(spec: ResourceClaimSpec) -> str:
    """A name that only this spec gets: pods asking the same share one template (its spec is immutable)."""
    digest = hashlib.sha256(_SPEC_ENCODER.encode(spec)).hexdigest()
    return TEMPLATE_PREFIX + digest[:DIGEST_HEX]


def claim_entry_name(container: str) -> str:
    """The pod's claim entry of a container: ``<container>-nvidia``, cut to a DNS label with a digest of the
    whole name when longer (HAMi-DRA's rule for its claim names)."""
    name = f"{container}-{CLAIM_SUFFIX}"
    if len(name) <= MAX_NAME:
        return name
    suffix = "-" + hashlib.sha256(name.encode()).hexdigest()[:TRUNCATED_HEX]
    return name[: MAX_NAME - len(suffix)].rstrip("-") + suffix
