"""The Hygon DCU family (hami-vendors §3): colon-form registration, generic handshake, the shared node lock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hami_common.annotations.devices import ContainerDevice, decode_pod_devices
from hami_common.annotations.keys import NODE_LOCK
from hami_common.resources import ContainerResources, DeviceRequest
from hami_common.scheduling.policy import PodPreferences
from hami_common.scheduling.usage import DeviceUsage, NodeUsage, device_usage_from
from hami_common.scheduling.vendor import ContainerFit, FitContext
from hami_common.vendors._common import (
    FULL_CORES,
    SHARED_LOCK_EXPIRY,
    check_quantities,
    count,
    device_lists,
    device_request,
    family_preferences,
    fit_walk,
    type_filter,
    whole_number,
)
from hami_common.vendors._family import Admission, NodeLockSpec, NodeView, QuotaSpec
from hami_common.vendors.hygon.config import HygonConfig
from hami_common.vendors.hygon.keys import (
    DCU,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_HANDSHAKE,
    NODE_REGISTER,
    NOUSE_DCUTYPE,
    NOUSE_UUID,
    USE_DCUTYPE,
    USE_UUID,
)
from hami_common.vendors.hygon.register import decode_register

__all__ = ["HygonFamily"]


@dataclass(frozen=True, slots=True)
class HygonFamily:
    """One backend, common word ``DCU``; cards register as ``DCU-<model>``."""

    config: HygonConfig = field(default_factory=HygonConfig)
    word: str = DCU

    @property
    def resource_names(self) -> tuple[str, ...]:
        c = self.config
        return (c.resource_count_name, c.resource_memory_name, c.resource_core_name)

    @property
    def handshake_key(self) -> str | None:
        return NODE_HANDSHAKE

    @property
    def register_key(self) -> str | None:
        return NODE_REGISTER

    @property
    def node_lock(self) -> NodeLockSpec:
        return NodeLockSpec(key=NODE_LOCK, expiry=SHARED_LOCK_EXPIRY, shared=True)

    @property
    def quota(self) -> QuotaSpec:
        c = self.config
        return QuotaSpec(
            memory_name=c.resource_memory_name,
            core_name=c.resource_core_name,
            memory_factor=c.factor,
        )

    def owns(self, dev: DeviceUsage) -> bool:
        return dev.type.upper().startswith(DCU)

    def preferences(self, base: PodPreferences, pod_annotations: Mapping[str, str]) -> PodPreferences:
        return family_preferences(
            base,
            pod_annotations,
            use_uuid=USE_UUID,
            nouse_uuid=NOUSE_UUID,
            use_type=USE_DCUTYPE,
            nouse_type=NOUSE_DCUTYPE,
        )

    def check(self, container: ContainerResources) -> None:
        check_quantities(container, self.resource_names, self.request)

    def admit(self, container: ContainerResources, pod_annotations: Mapping[str, str]) -> Admission:
        """Nothing is rewritten; the container asks for DCU when the count is in its limits."""
        return Admission(
            asks=self.config.resource_count_name in container.limits,
            limits=container.limits,
            requests=container.requests,
        )

    def request(self, container: ContainerResources) -> DeviceRequest | None:
        """Count, memory MiB × memoryFactor ≤ 2³¹-1, cores 0…2³¹-1 (absent: 100). Every quantity named is
        read, asked or not: one that cannot be is ``InvalidInput`` naming it, never "no DCU"."""
        c = self.config
        nums = count(container, c.resource_count_name)
        mib = whole_number(container, c.resource_memory_name, scale=c.factor)
        cores = whole_number(container, c.resource_core_name)
        if nums is None:
            return None
        memreq = 0 if mib is None else mib * c.factor
        return device_request(nums, DCU, memreq, FULL_CORES if cores is None else cores)

    def node_devices(self, node: NodeView) -> tuple[DeviceUsage, ...]:
        return tuple(device_usage_from(d) for d in decode_register(node.annotations.get(NODE_REGISTER)))

    def fit(self, devices: Sequence[DeviceUsage], request: DeviceRequest, ctx: FitContext) -> ContainerFit:
        """§0.2 order without a quota step; use/nouse-dcutype apply at the type step."""
        prefs = ctx.prefs
        return fit_walk(
            devices,
            request,
            ctx,
            word=DCU,
            type_ok=lambda dev: type_filter(dev.type, prefs.use_types, prefs.nouse_types),
        )

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
        return frozenset({DEVICES_TO_ALLOCATE, DEVICES_ALLOCATED})

    @property
    def user_annotations(self) -> frozenset[str]:
        return frozenset({USE_DCUTYPE, NOUSE_DCUTYPE, USE_UUID, NOUSE_UUID})

    def allocated(self, pod_annotations: Mapping[str, str]) -> tuple[tuple[ContainerDevice, ...], ...]:
        value = pod_annotations.get(DEVICES_ALLOCATED)
        return decode_pod_devices(value, DEVICES_ALLOCATED) if value else ()
