"""A small in-test MIG driver (the :class:`~hami_common.inventory._mig.MigControl` port) and helpers to build
MIG pods as the extender leaves them after a bind."""

from __future__ import annotations

import itertools
import threading
import uuid
from typing import Any

from hami_common.annotations import (
    MIG_ALLOCATIONS,
    MigAllocation,
    MigPlacement,
    MigProfile,
    encode_mig_allocations,
)
from hami_common.inventory import MigInstance, MigRefused

# A100-40GB's slice layout, reduced to three profiles (placements as NVIDIA's MIG user guide lists them).
PROFILES = (
    MigProfile(
        name="1g.5gb",
        memory_mb=4864,
        core=14,
        slice_count=1,
        placements=tuple(MigPlacement(start=s, size=1) for s in range(7)),
    ),
    MigProfile(
        name="3g.20gb",
        memory_mb=19968,
        core=42,
        slice_count=3,
        placements=(MigPlacement(start=0, size=4), MigPlacement(start=4, size=4)),
    ),
    MigProfile(name="7g.40gb", memory_mb=40192, core=100, slice_count=7, placements=(MigPlacement(start=0, size=8),)),
)


class FakeMig:
    """A driver's MIG side for the tests: refuses unknown GPUs and profiles, placements the profile does not
    offer and overlapping ones; ids as a driver assigns them (lowest free GPU instance id)."""

    def __init__(self, gpus: tuple[str, ...]) -> None:
        self.gpus = gpus
        self._lock = threading.Lock()
        self._instances: dict[tuple[str, int], MigInstance] = {}
        self._uuids = (f"MIG-{uuid.UUID(int=n)}" for n in itertools.count(1))
        self.creates = 0
        self.destroys = 0

    def profiles(self, gpu_uuid: str) -> tuple[MigProfile, ...]:
        return PROFILES if gpu_uuid in self.gpus else ()

    def instances(self, gpu_uuid: str | None = None) -> tuple[MigInstance, ...]:
        with self._lock:
            return tuple(i for i in self._instances.values() if gpu_uuid in (None, i.gpu_uuid))

    def create(self, gpu_uuid: str, profile: str, placement: MigPlacement) -> MigInstance:
        with self._lock:
            if gpu_uuid not in self.gpus:
                raise MigRefused(f"{gpu_uuid} is not a MIG GPU")
            offered = {p.name: p for p in PROFILES}.get(profile)
            if offered is None or placement not in offered.placements:
                raise MigRefused(f"{profile} cannot be placed at {placement}")
            taken = [i for i in self._instances.values() if i.gpu_uuid == gpu_uuid]
            for other in taken:
                if other.placement == placement and other.profile == profile:
                    return other
                lo, hi = other.placement.start, other.placement.start + other.placement.size
                if placement.start < hi and lo < placement.start + placement.size:
                    raise MigRefused(f"{profile} at {placement.start} overlaps GPU instance {other.gpu_instance_id}")
            ids = {i.gpu_instance_id for i in taken}
            gi = next(n for n in itertools.count(1) if n not in ids)
            made = MigInstance(
                gpu_uuid=gpu_uuid,
                profile=profile,
                placement=placement,
                gpu_instance_id=gi,
                compute_instance_id=0,
                mig_uuid=next(self._uuids),
            )
            self._instances[(gpu_uuid, gi)] = made
            self.creates += 1
            return made

    def destroy(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        with self._lock:
            if self._instances.pop((gpu_uuid, gpu_instance_id), None) is not None:
                self.destroys += 1


def reservation(container: int, device: int, gpu: str, profile: str, start: int, size: int) -> MigAllocation:
    return MigAllocation(
        container_index=container,
        device_index=device,
        gpu_uuid=gpu,
        profile=profile,
        placement=MigPlacement(start=start, size=size),
    )


def mig_annotations(*reservations: MigAllocation) -> dict[str, str]:
    return {MIG_ALLOCATIONS: encode_mig_allocations(reservations)}


def annotated_pod(uid: str, name: str, annotations: dict[str, str], *, phase: str = "Running") -> dict[str, Any]:
    """A pod body as a watch holds it, for :meth:`MigInstances.reclaim`."""
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid, "annotations": annotations},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": phase},
    }
