"""The Ascend webhook step and request parsing (hami-vendors §1.3-1.4): templates, 910C modules, modes.

Hard split (the default) carves a vNPU from a fixed template, so the webhook rounds memory **up** to the
smallest template that holds it (or to the whole card) and refuses core shares, which the template fixes.
Soft split (``huawei.com/vnpu-mode: hami-core``) keeps the raw memory and core values for hami-vnpu-core to
enforce. A 910C SuperPod module is two NPUs that are only handed out together.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hami_common.errors import InvalidInput
from hami_common.quantity import value
from hami_common.resources import ContainerResources, DeviceRequest
from hami_common.vendors._common import count, device_request, whole_number
from hami_common.vendors._family import Admission
from hami_common.vendors.ascend.config import ChipConfig, Template
from hami_common.vendors.ascend.keys import (
    ASCEND_910C,
    ASCEND_VISIBLE_DEVICES,
    MODE_HAMI_CORE,
    NPUS_PER_910C_MODULE,
    VNPU_MODE,
)

__all__ = ["Rounded", "admit", "is_hami_core", "parse_request", "round_memory"]


def is_hami_core(pod_annotations: Mapping[str, str]) -> bool:
    """Soft split only for exactly ``hami-core``; any other value, or none, is hard split."""
    return pod_annotations.get(VNPU_MODE) == MODE_HAMI_CORE


@dataclass(frozen=True, slots=True)
class Rounded:
    """Memory after template rounding: the template that carves it, or None for a whole card."""

    memory: int
    template: Template | None


def round_memory(chip: ChipConfig, mib: int) -> Rounded | None:
    """HAMi's ``trimMemory``: the smallest template ≥ ``mib``, else the whole card when ``mib`` ≤ capacity,
    else None (the request cannot be met on this model)."""
    for template in chip.templates_by_memory:
        if mib <= template.memory:
            return Rounded(memory=template.memory, template=template)
    if mib <= chip.memory_capacity:
        return Rounded(memory=chip.memory_allocatable, template=None)
    return None


def _quantity(text: str, resource: str, container: str) -> int:
    try:
        return value(text)
    except InvalidInput as err:
        raise InvalidInput(f"container {container}: {resource}: {err}") from err


def _core_asked(chip: ChipConfig, c: ContainerResources) -> bool:
    for source in (c.limits, c.requests):
        text = source.get(chip.resource_core_name)
        if text is not None and _quantity(text, chip.resource_core_name, c.name) > 0:
            return True
    return False


def admit(chip: ChipConfig, c: ContainerResources, pod_annotations: Mapping[str, str]) -> Admission:
    """HAMi's ``MutateAdmission`` for one container and one chip model; InvalidInput with HAMi's message."""
    limits, requests = dict(c.limits), dict(c.requests)
    count_text = c.limits.get(chip.resource_name)
    if count_text is None:  # only the count in *limits* makes the container ask for this NPU
        env = {ASCEND_VISIBLE_DEVICES: ""} if chip.overwrite_env else {}
        return Admission(asks=False, limits=c.limits, requests=c.requests, env=env)
    asked = _quantity(count_text, chip.resource_name, c.name)
    if chip.common_word == ASCEND_910C and chip.super_pod:
        if asked == 1:  # one NPU of a module is not schedulable: take the whole module
            limits[chip.resource_name] = str(NPUS_PER_910C_MODULE)
            if chip.resource_name in requests:
                requests[chip.resource_name] = str(NPUS_PER_910C_MODULE)
        elif asked % NPUS_PER_910C_MODULE:
            raise InvalidInput(f"{ASCEND_910C} device request must be 1 or 2*n, got {asked}")
    soft = is_hami_core(pod_annotations)
    if not soft and chip.resource_core_name and _core_asked(chip, c):
        raise InvalidInput(f"{chip.resource_core_name} is only supported in hami-core (soft split) mode")
    memory_text = c.quantity(chip.resource_memory_name)
    if memory_text is None:
        memory = chip.memory_allocatable
    else:
        memory = _quantity(memory_text, chip.resource_memory_name, c.name)
        if not soft:
            rounded = round_memory(chip, memory)
            if rounded is None:
                raise InvalidInput(f"{chip.resource_memory_name} {memory} is invalid")
            memory = rounded.memory
    # Multi-NPU pods take whole cards only; the count is the one the user wrote, before the 910C rewrite.
    if asked > 1 and not soft and memory != chip.memory_allocatable:
        raise InvalidInput("vNPU not supported for multiple devices")
    limits[chip.resource_memory_name] = str(memory)
    requests[chip.resource_memory_name] = str(memory)
    return Admission(
        asks=True,
        limits=limits,
        requests=requests,
        runtime_class=chip.runtime_class_name or None,
    )


def parse_request(chip: ChipConfig, c: ContainerResources) -> DeviceRequest | None:
    """HAMi's ``GenerateResourceRequests`` (§1.4); None when the container does not ask for this model.

    Memory is MiB, times ``memoryFactor`` when that is > 1, and must then fit int32 (so ``16Gi`` is
    refused); cores 0…2³¹-1. Every quantity named is read, asked or not: one that cannot be is
    ``InvalidInput`` naming it, never "not asking".
    """
    factor = max(chip.memory_factor, 1)
    nums = count(c, chip.resource_name)
    memory = whole_number(c, chip.resource_memory_name, scale=factor)
    cores = whole_number(c, chip.resource_core_name) if chip.resource_core_name else None
    if nums is None:
        return None
    memreq = 0 if memory is None else memory * factor
    return device_request(nums, chip.common_word, memreq, 0 if cores is None else cores)
