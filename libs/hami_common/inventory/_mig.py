"""MIG instances as values and the port that creates, lists and destroys them (hami-protocol §2.2, §5.4).

A GPU in MIG mode is cut into GPU instances, each at a placement (first memory slice and slice count) and
with one compute instance spanning it. The driver is the source of truth for which instances exist: the
allocator creates them at Allocate and destroys them when their pod ends, and after a restart it asks the
driver which exist to reclaim those no live pod owns. Backends: NVML on a real node, a state file shared by
the node's processes for the fake inventory, and a test double.

Every call blocks; services use ``asyncio.to_thread``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from hami_common.annotations.registration import MigPlacement, MigProfile

__all__ = ["MigControl", "MigInstance", "MigRefused"]


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One GPU instance with its compute instance, as the driver reports it."""

    gpu_uuid: str
    profile: str  # e.g. "1g.10gb"
    placement: MigPlacement
    gpu_instance_id: int
    compute_instance_id: int
    mig_uuid: str  # "MIG-…", what the container sees as its device


class MigRefused(Exception):
    """The driver refused to create an instance: unknown GPU or profile, GPU not in MIG mode, a placement the
    profile does not offer or one overlapping an existing instance. Not transient: retrying will not help."""


class MigNotPermitted(MigRefused):
    """The driver refused because this process may not configure MIG (``NVML_ERROR_NO_PERMISSION``): it lacks
    CAP_SYS_ADMIN or the MIG config capability device. A deployment fault, not a passing one: the message
    names what is missing, and no retry helps until the container is given it."""


class MigControl(Protocol):
    """The MIG side of a node's GPUs."""

    def profiles(self, gpu_uuid: str) -> tuple[MigProfile, ...]:
        """The profiles this GPU offers with their placements; empty when it is not in MIG mode."""
        ...

    def instances(self, gpu_uuid: str | None = None) -> tuple[MigInstance, ...]:
        """The instances that exist now, on one GPU or on all of them."""
        ...

    def create(self, gpu_uuid: str, profile: str, placement: MigPlacement) -> MigInstance:
        """Create the GPU instance at ``placement`` and a compute instance over all of it; MigRefused if the
        driver refuses. Creating what already exists at exactly that placement and profile returns it."""
        ...

    def destroy(self, gpu_uuid: str, gpu_instance_id: int) -> None:
        """Destroy the instance (compute instance first); destroying one that does not exist is no error."""
        ...
