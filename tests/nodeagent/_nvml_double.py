"""A stand-in for the ``pynvml`` module: just the calls :class:`NvmlInventory` and :class:`NvmlMigControl` make,
over declared GPUs.

Not a driver emulator: it exists so the mapping from NVML answers to :class:`Gpu` values (bus ids, NUMA from
sysfs, NVLink counting, topology levels, Xid events, health) and the MIG calls are tested on machines without
a GPU. It is passed to the backend's constructor, never patched in.

MIG: a card whose name has a profile table (``inventory/_migprofiles.py``) is MIG-capable, and ``mig=True``
turns MIG mode on. GPU instances are created at a placement and refused as a GPU refuses them: a placement the
profile does not offer (``INVALID_ARGUMENT``), one overlapping an existing instance
(``INSUFFICIENT_RESOURCES``), a GPU instance destroyed while it still has a compute instance (``IN_USE``).
Profile ids are ``100 + NVML_GPU_INSTANCE_PROFILE_*`` on purpose, so a caller that passes the enum where NVML
wants ``nvmlGpuInstanceProfileInfo.id`` fails here as it would on a driver. Arrays and counts are passed as
``pynvml`` passes them: ctypes arrays and a pointer to a ``c_uint``.
"""

from __future__ import annotations

import ctypes
import itertools
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Final

from hami_common.inventory import mig_card
from hami_common.inventory._migprofiles import MigCard, ProfileSpec

NVML_ERROR_INVALID_ARGUMENT: Final = 2
NVML_ERROR_NOT_SUPPORTED: Final = 3
NVML_ERROR_NO_PERMISSION: Final = 4
NVML_ERROR_NOT_FOUND: Final = 6
NVML_ERROR_INSUFFICIENT_SIZE: Final = 7
NVML_ERROR_TIMEOUT: Final = 10
NVML_ERROR_GPU_IS_LOST: Final = 15
NVML_ERROR_IN_USE: Final = 19
NVML_ERROR_INSUFFICIENT_RESOURCES: Final = 23
_GI_ID_BASE: Final = 100  # profile info id = base + enum
_CI_ID_BASE: Final = 200


class Placement(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@dataclass
class GpuInstance:
    card: int
    id: int
    spec: ProfileSpec
    start: int
    ci: int | None = None  # the compute instance's id, once created
    mig_uuid: str = ""


@dataclass(frozen=True)
class MigHandle:
    """The handle of a MIG device, as nvmlDeviceGetMigDeviceHandleByIndex gives it."""

    card: int
    gi: int


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Card:
    uuid: str
    name: str
    bus_id: str  # NVML form: 00000000:3B:00.0
    total_mib: int
    used_mib: int = 0
    util: int = 0
    nvlinks: list[str] = field(default_factory=list)  # remote bus id per active link
    lost: bool = False
    memory_unsupported: bool = False
    mig: bool = False  # MIG mode on (the card's model must have a profile table)
    instances: dict[int, GpuInstance] = field(default_factory=dict)  # GPU instance id -> instance

    @property
    def table(self) -> MigCard | None:
        return mig_card(self.name)


@dataclass
class NvmlDouble:
    cards: list[Card]
    topology: dict[tuple[int, int], int] = field(default_factory=dict)  # (i, j) -> NVML_TOPOLOGY_* level
    events: deque[SimpleNamespace] = field(default_factory=deque)
    initialised: bool = False
    NVMLError: type[NVMLError] = NVMLError
    NVML_NVLINK_MAX_LINKS: int = 18
    NVML_FEATURE_ENABLED: int = 1
    NVML_ERROR_NOT_SUPPORTED: int = NVML_ERROR_NOT_SUPPORTED
    nvmlEventTypeXidCriticalError: int = 0x8  # noqa: N815
    nvmlEventTypeDoubleBitEccError: int = 0x2  # noqa: N815
    NVML_DEVICE_MIG_DISABLE: int = 0
    NVML_DEVICE_MIG_ENABLE: int = 1
    NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: int = 0
    NVML_ERROR_INVALID_ARGUMENT: int = NVML_ERROR_INVALID_ARGUMENT
    NVML_ERROR_NOT_FOUND: int = NVML_ERROR_NOT_FOUND
    NVML_ERROR_IN_USE: int = NVML_ERROR_IN_USE
    NVML_ERROR_INSUFFICIENT_RESOURCES: int = NVML_ERROR_INSUFFICIENT_RESOURCES
    NVML_ERROR_NO_PERMISSION: int = NVML_ERROR_NO_PERMISSION
    c_nvmlGpuInstancePlacement_t: type[Placement] = Placement  # noqa: N815
    c_nvmlGpuInstance_t: type[ctypes.c_uint64] = ctypes.c_uint64  # noqa: N815
    c_nvmlComputeInstance_t: type[ctypes.c_uint64] = ctypes.c_uint64  # noqa: N815
    fail_compute_instance: bool = False  # the next compute instance creation fails (a create cut short)
    # False: the process lacks CAP_SYS_ADMIN or the MIG config capability, so every MIG create and destroy
    # is refused with NVML_ERROR_NO_PERMISSION (reading profiles and instances still works, as on a driver)
    mig_config_permitted: bool = True
    calls: list[str] = field(default_factory=list)  # the MIG calls made, in order
    _uuids: Any = field(
        default_factory=lambda: (f"MIG-5e4f0c1a-{n:04x}-4000-8000-00000000{n:04x}" for n in itertools.count(1))
    )

    def _check_mig_permission(self) -> None:
        if not self.mig_config_permitted:
            raise NVMLError(NVML_ERROR_NO_PERMISSION)

    def nvmlInit(self) -> None:  # noqa: N802
        self.initialised = True

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:  # noqa: N802
        return index

    def _card(self, handle: int) -> Card:
        card = self.cards[handle]
        if card.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return card

    def nvmlDeviceGetUUID(self, handle: int | MigHandle) -> bytes:  # noqa: N802
        if isinstance(handle, MigHandle):
            return self._gi(handle.card, handle.gi).mig_uuid.encode()
        return self.cards[handle].uuid.encode()

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:  # noqa: N802
        for index, card in enumerate(self.cards):
            if card.uuid == uuid:
                return index
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetName(self, handle: int) -> str:  # noqa: N802
        return self.cards[handle].name

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=self.cards[handle].bus_id.encode())

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:  # noqa: N802
        card = self._card(handle)
        if card.memory_unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(total=card.total_mib << 20, used=card.used_mib << 20)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(gpu=self._card(handle).util, memory=self._card(handle).util // 2)

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:  # noqa: N802
        if not self.cards[handle].nvlinks or link >= len(self.cards[handle].nvlinks):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=self.cards[handle].nvlinks[link])

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:  # noqa: N802
        if (a, b) not in self.topology:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return self.topology[(a, b)]

    def nvmlEventSetCreate(self) -> str:  # noqa: N802
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, mask: int, event_set: str) -> None:  # noqa: N802
        """Every card accepts the registration."""

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:  # noqa: N802
        if not self.events:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        return self.events.popleft()

    def nvmlEventSetFree(self, event_set: str) -> None:  # noqa: N802
        """Nothing to free."""

    def xid(self, handle: int, xid: int) -> None:
        """Queue a critical-Xid event for ``handle``, as the driver would."""
        self.events.append(SimpleNamespace(device=handle, eventType=self.nvmlEventTypeXidCriticalError, eventData=xid))

    # --- MIG --------------------------------------------------------------------------------------------------

    def _mig_card(self, handle: int) -> tuple[Card, MigCard]:
        card = self._card(handle)
        table = card.table
        if table is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return card, table

    def _enabled(self, handle: int) -> tuple[Card, MigCard]:
        card, table = self._mig_card(handle)
        if not card.mig:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return card, table

    def _spec_by_id(self, handle: int, profile_id: int) -> ProfileSpec:
        _, table = self._enabled(handle)
        spec = next((p for p in table.profiles if _GI_ID_BASE + p.nvml_profile == profile_id), None)
        if spec is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return spec

    def _gi(self, handle: int, gi_id: int) -> GpuInstance:
        gi = self.cards[handle].instances.get(gi_id)
        if gi is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return gi

    @staticmethod
    def _gi_handle(gi: GpuInstance) -> int:
        return (gi.card << 8) | gi.id

    def _from_gi_handle(self, gi_handle: Any) -> GpuInstance:
        value = int(getattr(gi_handle, "value", gi_handle))
        return self._gi(value >> 8, value & 0xFF)

    @staticmethod
    def _fill(array: Any, count_ref: Any, values: list[Any]) -> None:
        if len(array) < len(values):
            count_ref.contents.value = len(values)
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, value in enumerate(values):
            array[i] = value
        count_ref.contents.value = len(values)

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:  # noqa: N802
        card, _ = self._mig_card(handle)
        mode = self.NVML_DEVICE_MIG_ENABLE if card.mig else self.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: int, profile: int, version: int = 2) -> SimpleNamespace:  # noqa: N802
        _, table = self._enabled(handle)
        spec = next((p for p in table.profiles if p.nvml_profile == profile), None)
        if spec is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(
            id=_GI_ID_BASE + profile, sliceCount=spec.slices, instanceCount=spec.instances,
            memorySizeMB=spec.memory_mib, name=f"MIG {spec.name}".encode(),
        )  # fmt: skip

    def nvmlDeviceGetGpuInstancePossiblePlacements(  # noqa: N802
        self, handle: int, profile_id: int, placements: Any, count_ref: Any
    ) -> int:
        spec = self._spec_by_id(handle, profile_id)
        self._fill(placements, count_ref, [Placement(s, spec.size) for s in spec.starts])
        return 0

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: int, profile_id: int, placement: Any) -> int:  # noqa: N802
        self.calls.append("create-gi")
        self._check_mig_permission()
        where = getattr(placement, "_obj", placement)  # ctypes.byref(struct) or the struct itself
        spec = self._spec_by_id(handle, profile_id)
        start, size = int(where.start), int(where.size)
        if size != spec.size or start not in spec.starts:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        card = self.cards[handle]
        for gi in card.instances.values():
            if gi.start < start + size and start < gi.start + gi.spec.size:
                raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)  # what a GPU answers for an overlap
        gi_id = next(n for n in itertools.count(1) if n not in card.instances)
        card.instances[gi_id] = GpuInstance(card=handle, id=gi_id, spec=spec, start=start)
        return self._gi_handle(card.instances[gi_id])

    def nvmlDeviceGetGpuInstances(self, handle: int, profile_id: int, instances: Any, count_ref: Any) -> int:  # noqa: N802
        spec = self._spec_by_id(handle, profile_id)
        found = [self._gi_handle(gi) for gi in self.cards[handle].instances.values() if gi.spec == spec]
        self._fill(instances, count_ref, found)
        return 0

    def nvmlDeviceGetGpuInstanceById(self, handle: int, gi_id: int) -> int:  # noqa: N802
        self._enabled(handle)
        return self._gi_handle(self._gi(handle, gi_id))

    def nvmlGpuInstanceGetInfo(self, gi_handle: Any) -> SimpleNamespace:  # noqa: N802
        gi = self._from_gi_handle(gi_handle)
        return SimpleNamespace(
            device=gi.card, id=gi.id, profileId=_GI_ID_BASE + gi.spec.nvml_profile,
            placement=SimpleNamespace(start=gi.start, size=gi.spec.size),
        )  # fmt: skip

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(  # noqa: N802
        self, gi_handle: Any, profile: int, eng_profile: int, version: int = 2
    ) -> SimpleNamespace:
        gi = self._from_gi_handle(gi_handle)
        slices = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}.get(profile)
        if slices is None or slices > gi.spec.slices or eng_profile != 0:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(id=_CI_ID_BASE + profile, sliceCount=slices, instanceCount=gi.spec.slices // slices)

    def nvmlGpuInstanceCreateComputeInstance(self, gi_handle: Any, profile_id: int) -> int:  # noqa: N802
        self.calls.append("create-ci")
        self._check_mig_permission()
        gi = self._from_gi_handle(gi_handle)
        if self.fail_compute_instance:
            self.fail_compute_instance = False
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if profile_id != _CI_ID_BASE + {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[gi.spec.slices]:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # this double only spans a GPU instance whole
        if gi.ci is not None:
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi.ci, gi.mig_uuid = 0, next(self._uuids)
        return self._gi_handle(gi)  # one compute instance per GPU instance: the GPU instance's handle names it

    def nvmlGpuInstanceGetComputeInstances(  # noqa: N802
        self, gi_handle: Any, profile_id: int, instances: Any, count_ref: Any
    ) -> int:
        gi = self._from_gi_handle(gi_handle)
        self._fill(instances, count_ref, [self._gi_handle(gi)] if gi.ci is not None else [])
        return 0

    def nvmlComputeInstanceGetInfo(self, ci_handle: Any) -> SimpleNamespace:  # noqa: N802
        gi = self._from_gi_handle(ci_handle)
        if gi.ci is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return SimpleNamespace(id=gi.ci, gpuInstance=self._gi_handle(gi), device=gi.card)

    def nvmlComputeInstanceDestroy(self, ci_handle: Any) -> int:  # noqa: N802
        self.calls.append("destroy-ci")
        self._check_mig_permission()
        gi = self._from_gi_handle(ci_handle)
        if gi.ci is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        gi.ci, gi.mig_uuid = None, ""
        return 0

    def nvmlGpuInstanceDestroy(self, gi_handle: Any) -> int:  # noqa: N802
        self.calls.append("destroy-gi")
        self._check_mig_permission()
        gi = self._from_gi_handle(gi_handle)
        if gi.ci is not None:
            raise NVMLError(NVML_ERROR_IN_USE)  # a GPU instance with a compute instance cannot go
        del self.cards[gi.card].instances[gi.id]
        return 0

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: int) -> int:  # noqa: N802
        _, table = self._mig_card(handle)
        return table.compute_slices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: int, index: int) -> MigHandle:  # noqa: N802
        self._enabled(handle)
        ready = sorted(gi.id for gi in self.cards[handle].instances.values() if gi.ci is not None)
        if index >= len(ready):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return MigHandle(handle, ready[index])

    def nvmlDeviceGetGpuInstanceId(self, mig: MigHandle) -> int:  # noqa: N802
        return mig.gi
