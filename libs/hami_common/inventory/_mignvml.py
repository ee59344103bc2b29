"""MIG through NVML (``nvidia-ml-py``): the profiles a GPU offers, and its GPU and compute instances.

Profiles: for each GPU instance profile the GPU supports (``nvmlDeviceGetGpuInstanceProfileInfo``), its slice
count, memory and possible placements (``nvmlDeviceGetGpuInstancePossiblePlacements``, the ``_v2`` entry point);
named and scored as the fake inventory's tables are (:func:`profile_name`, :func:`profile_core`), so both
backends register the same JSON for the same card. Media-extension and graphics variants are skipped (HAMi's
name would repeat a plain profile's).

Instances: a GPU instance is created at the placement the scheduler chose
(``nvmlDeviceCreateGpuInstanceWithPlacement``) with one compute instance over all of it; the MIG device's UUID
is found among the GPU's MIG device handles by GPU instance id. The driver refuses a placement that overlaps an
instance (``NVML_ERROR_INSUFFICIENT_RESOURCES``): that, an unknown profile or a GPU not in MIG mode is
:class:`MigRefused`. ``NVML_ERROR_NO_PERMISSION`` is :class:`MigNotPermitted` (a MigRefused): creating and
destroying instances needs CAP_SYS_ADMIN and the MIG config capability device, which the deployment must give
the allocator container (docs/deploy.md, "MIG"); retrying cannot help, so it is not transient, and its message
says what is missing. Any other NVML failure is a :class:`TransientError`.

Every call blocks; services use ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import threading
from dataclasses import dataclass
from typing import Any, Final

from hami_common.annotations.registration import MigPlacement, MigProfile
from hami_common.errors import TransientError
from hami_common.inventory._mig import MigInstance, MigNotPermitted, MigRefused
from hami_common.inventory._migprofiles import profile_core, profile_name

__all__ = ["NvmlMigControl", "read_mig_profiles"]

# NVML_GPU_INSTANCE_PROFILE_* with one compute-and-memory shape each: 1, 2, 3, 4, 7, 8, 6 slices and the 1-slice
# profile with two memory slices (REV2). REV1 (+me), GFX, NO_ME and ALL_ME variants repeat a name.
_PLAIN_GI_PROFILES: Final = (0x0, 0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x9)
# compute instance profile spanning a GPU instance of n slices (NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE)
_CI_PROFILE_BY_SLICES: Final = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
_MAX_INSTANCES: Final = 32  # room for the answer of a list call: NVML has at most 7 (8 memory slices)
_REFUSALS: Final = ("NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INSUFFICIENT_RESOURCES",
                    "NVML_ERROR_IN_USE")  # fmt: skip
_NO_PERMISSION: Final = "NVML_ERROR_NO_PERMISSION"
# What NVML's MIG configuration calls need, as a deployment must grant it (deploy/kustomize/components/mig).
_MIG_PRIVILEGES: Final = (
    "the allocator needs CAP_SYS_ADMIN and the MIG config capability device (/dev/nvidia-caps, mounted by the "
    "NVIDIA container runtime for NVIDIA_MIG_CONFIG_DEVICES=all) to create and destroy MIG instances; "
    "deploy with the mig component (docs/deploy.md, MIG)"
)


def _text(value: Any) -> str:
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class _Shape:
    """What creating or listing instances of one profile needs."""

    profile: MigProfile
    gi_profile_id: int  # nvmlGpuInstanceProfileInfo.id, the id the create and list calls take
    ci_profile: int  # NVML_COMPUTE_INSTANCE_PROFILE_*


def _error_value(nv: Any, err: Exception) -> int | None:
    value = getattr(err, "value", None)
    return value if isinstance(value, int) else None


def _mig_on(nv: Any, handle: Any) -> bool:
    try:
        current = nv.nvmlDeviceGetMigMode(handle)[0]
    except nv.NVMLError:
        return False  # NOT_SUPPORTED: a GPU without MIG
    return bool(current == nv.NVML_DEVICE_MIG_ENABLE)


def _shapes(nv: Any, handle: Any) -> tuple[_Shape, ...]:
    if not _mig_on(nv, handle):
        return ()
    found: list[tuple[MigProfile, int]] = []
    for gi_profile in _PLAIN_GI_PROFILES:
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(handle, gi_profile)
        except nv.NVMLError:
            continue  # this GPU does not offer the shape
        placements = (nv.c_nvmlGpuInstancePlacement_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(_MAX_INSTANCES)
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, info.id, placements, ctypes.pointer(count))
        slices, memory = int(info.sliceCount), int(info.memorySizeMB)
        profile = MigProfile(
            name=profile_name(slices, memory),
            memory_mb=memory,
            core=0,  # set once the card's slice count is known
            slice_count=slices,
            placements=tuple(MigPlacement(start=int(p.start), size=int(p.size)) for p in placements[: count.value]),
        )
        found.append((profile, int(info.id)))
    card_slices = max((p.slice_count for p, _ in found), default=1)
    shapes = [
        _Shape(
            profile=MigProfile(
                name=p.name,
                memory_mb=p.memory_mb,
                core=profile_core(p.slice_count, card_slices),
                slice_count=p.slice_count,
                placements=p.placements,
            ),
            gi_profile_id=gi_id,
            ci_profile=_CI_PROFILE_BY_SLICES.get(p.slice_count, 0),
        )
        for p, gi_id in found
    ]
    shapes.sort(key=lambda s: (s.profile.slice_count, s.profile.memory_mb))
    return tuple(shapes)


def read_mig_profiles(nv: Any, handle: Any) -> tuple[MigProfile, ...]:
    """The profiles the GPU behind ``handle`` offers, smallest first; empty when MIG mode is off."""
    return tuple(s.profile for s in _shapes(nv, handle))


class NvmlMigControl:
    """:class:`~hami_common.inventory.MigControl` over the driver's NVML library."""

    def __init__(self, *, library: Any = None) -> None:
        """``library`` is the ``pynvml`` module (imported when not given); tests pass a stand-in here."""
        self._nv = library or importlib.import_module("pynvml")
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as err:
            raise TransientError(f"NVML is not available: {err}") from err
        self._shapes: dict[str, tuple[_Shape, ...]] = {}
        self._lock = threading.Lock()  # one create or destroy at a time: the driver's answers stay consistent

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError as err:
            value = _error_value(nv, err)
            if value is not None and value == getattr(nv, _NO_PERMISSION, None):
                raise MigNotPermitted(f"{what}: {err}: {_MIG_PRIVILEGES}") from err
            if value is not None and value in {getattr(nv, name, None) for name in _REFUSALS}:
                raise MigRefused(f"{what}: {err}") from err
            raise TransientError(f"{what}: {err}") from err

    def _handle(self, gpu_uuid: str) -> Any:
        try:
            return self._nv.nvmlDeviceGetHandleByUUID(gpu_uuid)
        except self._nv.NVMLError as err:
            raise MigRefused(f"GPU {gpu_uuid} is not on this node: {err}") from err

    def _shapes_of(self, gpu_uuid: str, handle: Any) -> tuple[_Shape, ...]:
        if gpu_uuid not in self._shapes:
            self._shapes[gpu_uuid] = self._call(f"MIG profiles of {gpu_uuid}", _shapes, self._nv, handle)
        return self._shapes[gpu_uuid]

    def profiles(self, gpu_uuid: str) -> tuple[MigProfile, ...]:
        try:
            handle = self._handle(gpu_uuid)
        except MigRefused:
            return ()
        return tuple(s.profile for s in self._shapes_of(gpu_uuid, handle))

    def _mig_uuids(self, handle: Any) -> dict[int, str]:
        """GPU instance id -> MIG device UUID, for the instances that have a compute instance."""
        nv = self._nv
        found: dict[int, str] = {}
        for index in range(int(self._call("MIG device count", nv.nvmlDeviceGetMaxMigDeviceCount, handle))):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except nv.NVMLError:
                continue  # no MIG device at this index
            gi = int(self._call("MIG device's GPU instance", nv.nvmlDeviceGetGpuInstanceId, mig))
            found[gi] = _text(self._call("MIG device's UUID", nv.nvmlDeviceGetUUID, mig))
        return found

    def _list(self, gpu_uuid: str, handle: Any) -> list[tuple[MigInstance, Any, _Shape]]:
        nv = self._nv
        shapes = self._shapes_of(gpu_uuid, handle)
        if not shapes:
            return []
        uuids = self._mig_uuids(handle)
        listed: list[tuple[MigInstance, Any, _Shape]] = []
        for shape in shapes:
            gis = (nv.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
            count = ctypes.c_uint(_MAX_INSTANCES)
            self._call("list GPU instances", nv.nvmlDeviceGetGpuInstances, handle, shape.gi_profile_id, gis,
                       ctypes.pointer(count))  # fmt: skip
            for gi in gis[: count.value]:
                info = self._call("GPU instance info", nv.nvmlGpuInstanceGetInfo, gi)
                ci_id = self._compute_instance_id(gi, shape)
                listed.append(
                    (
                        MigInstance(
                            gpu_uuid=gpu_uuid,
                            profile=shape.profile.name,
                            placement=MigPlacement(start=int(info.placement.start), size=int(info.placement.size)),
                            gpu_instance_id=int(info.id),
                            compute_instance_id=ci_id,
                            mig_uuid=uuids.get(int(info.id), ""),
                        ),
                        gi,
                        shape,
                    )
                )
        listed.sort(key=lambda t: (t[0].placement.start, t[0].gpu_instance_id))
        return listed

    def _compute_instances(self, gi: Any, shape: _Shape) -> list[Any]:
        nv = self._nv
        try:
            ci_info = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, shape.ci_profile, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
        except nv.NVMLError:
            return []
        cis = (nv.c_nvmlComputeInstance_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(_MAX_INSTANCES)
        self._call("list compute instances", nv.nvmlGpuInstanceGetComputeInstances, gi, ci_info.id, cis,
                   ctypes.pointer(count))  # fmt: skip
        return list(cis[: count.value])

    def _compute_instance_id(self, gi: Any, shape: _Shape) -> int:
        """The id of the compute instance over ``gi``; -1 for a GPU instance left without one (a create cut short:
        the reclaim destroys it like any instance no pod owns)."""
        cis = self._compute_instances(gi, shape)
        if not cis:
            return -1
        return int(self._call("compute instance info", self._nv.nvmlComputeInstanceGetInfo, cis[0]).id)

    def instances(self, gpu_uuid: str | None = None) -> tuple[MigInstance, ...]:
        nv = self._nv
        if gpu_uuid is not None:
            try:
                handle = self._handle(gpu_uuid)
            except MigRefused:
                return ()
            return tuple(i for i, _, _ in self._list(gpu_uuid, handle))
        found: list[MigInstance] = []
        for index in range(int(self._call("device count", nv.nvmlDeviceGetCount))):
            handle = self._call(f"GPU {index}", nv.nvmlDeviceGetHandleByIndex, index)
            uuid = _text(self._call(f"GPU {index} UUID", nv.nvmlDeviceGetUUID, handle))
            found.extend(i for i, _, _ in self._list(uuid, handle))
        return tuple(found)

    def create(self, gpu_uuid: str, profile: str, placement: MigPlacement) -> MigInstance:
        nv = self._nv
        with self._lock:
            handle = self._handle(gpu_uuid)
            shapes = self._shapes_of(gpu_uuid, handle)
            if not shapes:
                raise MigRefused(f"GPU {gpu_uuid} is not in MIG mode")
            shape = next((s for s in shapes if s.profile.name == profile), None)
            if shape is None:
                raise MigRefused(f"GPU {gpu_uuid} offers no MIG profile {profile!r}")
            if placement not in shape.profile.placements:
                raise MigRefused(f"profile {profile} cannot be placed at {placement.start}:{placement.size}")
            for existing, _, _ in self._list(gpu_uuid, handle):
                if existing.profile == profile and existing.placement == placement and existing.mig_uuid:
                    return existing  # already there: creating is idempotent
            where = nv.c_nvmlGpuInstancePlacement_t()
            where.start, where.size = placement.start, placement.size
            gi = self._call(
                f"create {profile} at {placement.start}:{placement.size} on {gpu_uuid}",
                nv.nvmlDeviceCreateGpuInstanceWithPlacement, handle, shape.gi_profile_id, ctypes.byref(where),
            )  # fmt: skip
            try:
                gi_id = int(self._call("GPU instance info", nv.nvmlGpuInstanceGetInfo, gi).id)
                ci_info = self._call(
                    "compute instance profile", nv.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi,
                    shape.ci_profile, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                )  # fmt: skip
                ci = self._call("create compute instance", nv.nvmlGpuInstanceCreateComputeInstance, gi, ci_info.id)
                ci_id = int(self._call("compute instance info", nv.nvmlComputeInstanceGetInfo, ci).id)
                mig_uuid = self._mig_uuids(handle).get(gi_id, "")
                if not mig_uuid:
                    raise TransientError(f"GPU instance {gi_id} on {gpu_uuid} has no MIG device")
            except BaseException:
                self._destroy_gi(gi, shape)  # leave nothing half made behind
                raise
            return MigInstance(gpu_uuid, profile, placement, gi_id, ci_id, mig_uuid)

    def _destroy_gi(self, gi: Any, shape: _Shape) -> None:
        nv = self._nv
        for ci in self._compute_instances(gi, shape):
            self._call("destroy compute instance", nv.nvmlComputeInstanceDestroy, ci)
        self._call("destroy GPU instance", nv.nvmlGpuInstanceDestroy, gi)

    def destroy(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        with self._lock:
            try:
                handle = self._handle(gpu_uuid)
            except MigRefused:
                return
            for existing, gi, shape in self._list(gpu_uuid, handle):
                if existing.gpu_instance_id == gpu_instance_id:
                    self._destroy_gi(gi, shape)
                    return

    def close(self) -> None:
        with contextlib.suppress(self._nv.NVMLError):  # nothing to release on a library that failed
            self._nv.nvmlShutdown()
