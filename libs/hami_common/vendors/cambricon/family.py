"""The Cambricon MLU family (hami-vendors §2): devices from node capacity, its own lock, no handshake."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hami_common.annotations.devices import ContainerDevice, decode_pod_devices
from hami_common.errors import AnnotationError, InvalidInput
from hami_common.quantity import as_int
from hami_common.resources import ContainerResources, DeviceRequest
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.usage import DeviceUsage, NodeUsage
from hami_common.scheduling.vendor import ContainerFit, FitContext
from hami_common.vendors._common import (
    FULL_CORES,
    check_quantities,
    count,
    device_lists,
    device_request,
    family_preferences,
    fit_walk,
    whole_number,
)
from hami_common.vendors._family import Admission, NodeLockSpec, NodeView, QuotaSpec
from hami_common.vendors.cambricon.config import CambriconConfig
from hami_common.vendors.cambricon.keys import (
    DEVICE_ID_INFIX,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    DSMLU_ASSIGHED,
    DSMLU_ASSIGNED,
    DSMLU_PROFILE,
    DSMLU_PROFILE_INSTANCE,
    LOCK_EXPIRY,
    MEMORY_UNIT,
    MLU,
    NODE_LOCK,
    NOT_ASSIGNED,
    NOUSE_MLUTYPE,
    NOUSE_UUID,
    USE_MLUTYPE,
    USE_UUID,
)

__all__ = ["CambriconFamily", "devices_from_capacity", "dsmlu_profile"]

SLOTS_PER_MLU = 100  # each invented card takes up to 100 sharers: its slots are its cores


def _capacity(node: NodeView, resource: str) -> int:
    text = node.capacity.get(resource)
    if text is None:
        return 0
    try:
        number = as_int(text)
    except InvalidInput as err:
        raise AnnotationError(resource, f"node {node.name} capacity: {err}") from err
    if number is None or number < 0:
        raise AnnotationError(resource, f"node {node.name} capacity is not a whole number: {text!r}")
    return number


def devices_from_capacity(node: NodeView, config: CambriconConfig) -> tuple[DeviceUsage, ...]:
    """HAMi's invented MLUs: ceil(vcore/100) cards ``<node>-cambricon-mlu-<i>``, memory shared out evenly.

    Card memory is vmemory × 256 × 100 / vcore MiB (integer division). No vcore capacity (or 0) means no
    MLU on the node: AnnotationError ``device not found <vcore name>``. A missing vmemory is 0, as in HAMi.
    """
    cores = _capacity(node, config.resource_core_name)
    if cores == 0:
        raise AnnotationError(config.resource_core_name, f"device not found {config.resource_core_name}")
    units = _capacity(node, config.resource_memory_name)
    devmem = units * MEMORY_UNIT * FULL_CORES // cores
    cards = -(-cores // FULL_CORES)
    return tuple(
        DeviceUsage(
            id=f"{node.name}{DEVICE_ID_INFIX}{i}",
            index=i,
            count=SLOTS_PER_MLU,
            totalmem=devmem,
            totalcore=FULL_CORES,
            type=MLU,
        )
        for i in range(cards)
    )


def _index_of(node: NodeUsage, uuid: str) -> int:
    """The card's registration index; from its invented id when the node no longer lists it."""
    for dev in node.devices:
        if dev.id == uuid:
            return dev.index
    _, infix, tail = uuid.rpartition(DEVICE_ID_INFIX)
    return int(tail) if infix and tail.isascii() and tail.isdigit() else 0


def dsmlu_profile(node: NodeUsage, picked: Sequence[Sequence[ContainerDevice]]) -> str | None:
    """``<index>_<cores>_<memory units>`` of the first card of the first container that has one."""
    for devices in picked:
        if devices:
            first = devices[0]
            return f"{_index_of(node, first.uuid)}_{first.usedcores}_{first.usedmem // MEMORY_UNIT}"
    return None


@dataclass(frozen=True, slots=True)
class CambriconFamily:
    """One backend, common word ``MLU``; see :mod:`hami_common.vendors.cambricon.keys` for its names."""

    config: CambriconConfig = field(default_factory=CambriconConfig)
    word: str = MLU

    @property
    def resource_names(self) -> tuple[str, ...]:
        c = self.config
        return (c.resource_count_name, c.resource_memory_name, c.resource_core_name)

    @property
    def handshake_key(self) -> str | None:
        return None  # CheckHealth is always (true, true): devices are re-read from capacity every pass

    @property
    def register_key(self) -> str | None:
        return None  # the devices are the node's capacity, as Cambricon's own device plugin advertises them

    @property
    def node_lock(self) -> NodeLockSpec:
        return NodeLockSpec(key=NODE_LOCK, expiry=LOCK_EXPIRY, shared=False)

    @property
    def quota(self) -> QuotaSpec:
        """ResourceQuota vmemory counts 256 MiB units, as the pod's resource does (HAMi's FitQuota × 256)."""
        c = self.config
        return QuotaSpec(
            memory_name=c.resource_memory_name,
            core_name=c.resource_core_name,
            memory_factor=MEMORY_UNIT,
        )

    def owns(self, dev: DeviceUsage) -> bool:
        return dev.type == MLU

    def preferences(self, base: PodPreferences, pod_annotations: Mapping[str, str]) -> PodPreferences:
        return family_preferences(base, pod_annotations, use_uuid=USE_UUID, nouse_uuid=NOUSE_UUID)

    def check(self, container: ContainerResources) -> None:
        check_quantities(container, self.resource_names, self.request)

    def admit(self, container: ContainerResources, pod_annotations: Mapping[str, str]) -> Admission:
        """Nothing is rewritten; the container asks for MLU when the count is in its limits."""
        return Admission(
            asks=self.config.resource_count_name in container.limits,
            limits=container.limits,
            requests=container.requests,
        )

    def request(self, container: ContainerResources) -> DeviceRequest | None:
        """Count, memory in 256 MiB units (MiB must fit int32) and cores (absent: 100). Every quantity named
        is read, asked or not: one that cannot be is ``InvalidInput`` naming it, never "no MLU"."""
        nums = count(container, self.config.resource_count_name)
        units = whole_number(container, self.config.resource_memory_name, scale=MEMORY_UNIT)
        cores = whole_number(container, self.config.resource_core_name)
        if nums is None:
            return None
        memreq = 0 if units is None else units * MEMORY_UNIT
        return device_request(nums, MLU, memreq, FULL_CORES if cores is None else cores)

    def node_devices(self, node: NodeView) -> tuple[DeviceUsage, ...]:
        return devices_from_capacity(node, self.config)

    def fit(self, devices: Sequence[DeviceUsage], request: DeviceRequest, ctx: FitContext) -> ContainerFit:
        """§0.2 order with Cambricon's quota step: ResourceQuota vmemory is in 256 MiB units."""
        return fit_walk(devices, request, ctx, word=MLU, quota_factor=MEMORY_UNIT)

    def score_node(self, node: NodeUsage, picked: Sequence[Sequence[ContainerDevice]]) -> float:
        return 0.0

    def pod_annotations(
        self, node: NodeUsage, picked: Sequence[Sequence[ContainerDevice]], pod_annotations: Mapping[str, str]
    ) -> Mapping[str, str]:
        profile = dsmlu_profile(node, picked)
        if profile is None:
            return {}
        return {
            **device_lists(picked, DEVICES_TO_ALLOCATE, DEVICES_ALLOCATED),
            DSMLU_PROFILE: profile,
            DSMLU_ASSIGNED: NOT_ASSIGNED,
            DSMLU_ASSIGHED: NOT_ASSIGNED,
        }

    @property
    def user_annotations(self) -> frozenset[str]:
        return frozenset({USE_UUID, NOUSE_UUID, USE_MLUTYPE, NOUSE_MLUTYPE})  # the type lists: known, unread

    @property
    def owned_annotations(self) -> frozenset[str]:
        return frozenset(
            {
                DEVICES_TO_ALLOCATE,
                DEVICES_ALLOCATED,
                DSMLU_PROFILE,
                DSMLU_ASSIGNED,
                DSMLU_ASSIGHED,
                DSMLU_PROFILE_INSTANCE,
            }
        )

    def allocated(self, pod_annotations: Mapping[str, str]) -> tuple[tuple[ContainerDevice, ...], ...]:
        value = pod_annotations.get(DEVICES_ALLOCATED)
        return decode_pod_devices(value, DEVICES_ALLOCATED) if value else ()
