"""The allocator's MIG side: create the instances a container was granted, destroy those no pod owns.

At Allocate the plugin creates, for each of the container's ``hami.io/vgpu-mig-allocations`` reservations,
the GPU instance at the reserved placement and a compute instance over it (:meth:`MigInstances.realise`);
creating what already exists there returns it, so a retried Allocate reuses what the first try made.

The driver outlives the plugin, so what exists on the GPUs is the source of truth for what must go. An
instance is *owned* while a live pod on the node (one the node's pod watch holds, not Succeeded or Failed)
has a reservation at its GPU, profile and placement, or while this process created it for a pod not known
to be gone (its annotation may not show the runtime ids yet, or the watch may not show the pod yet).
:meth:`MigInstances.reclaim` destroys the others: at once when the pod that owned them is known to have
ended, and otherwise (after a restart, nothing is known of who created what) once they have been seen
unowned for ``grace`` seconds, so an instance created moments ago by an Allocate whose pod the watch does
not show yet survives. It runs at start (once the pod watch has synced), whenever a pod ends, and every
``interval`` seconds.

All calls into :class:`~hami_common.inventory.MigControl` block; the async callers use ``to_thread``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from hami_allocator.pending import PodLike
from hami_common import logkeys
from hami_common.annotations import MIG_ALLOCATIONS, MigAllocation, decode_mig_allocations
from hami_common.errors import AnnotationError, HamiError
from hami_common.inventory import MigControl, MigInstance, MigRefused

__all__ = ["MigInstances", "Reclaimed", "realised"]

log = logging.getLogger(__name__)

_ENDED = frozenset({"Succeeded", "Failed"})

_Slot = tuple[str, str, int, int]  # gpu UUID, profile, placement start, size


def _slot_of(m: MigAllocation | MigInstance) -> _Slot:
    return (m.gpu_uuid, m.profile, m.placement.start, m.placement.size)


def realised(reservation: MigAllocation, instance: MigInstance) -> MigAllocation:
    """The reservation with the runtime ids of the instance created for it."""
    return msgspec.structs.replace(
        reservation,
        mig_uuid=instance.mig_uuid,
        gpu_instance_id=instance.gpu_instance_id,
        compute_instance_id=instance.compute_instance_id,
    )


@dataclass(frozen=True, slots=True)
class Reclaimed:
    """One instance destroyed, and why."""

    instance: MigInstance
    reason: str


@dataclass(eq=False)
class MigInstances:
    """Creation, ownership and reclaim of the node's MIG instances. Not thread-safe: the allocator runs one
    call at a time (under its Allocate lock)."""

    control: MigControl
    node: str = ""
    grace: float = 60.0  # seconds an unowned instance nobody here created may live (a racing Allocate's)
    clock: Callable[[], float] = time.monotonic
    # (gpu UUID, GPU instance id) -> UID of the pod this process created it for
    created: dict[tuple[str, int], str] = field(default_factory=dict)
    # (gpu UUID, GPU instance id) -> when a reclaim pass first found it unowned
    _unowned_since: dict[tuple[str, int], float] = field(default_factory=dict)
    _mig_mode: dict[str, bool] = field(default_factory=dict)

    def modes_known(self, gpu_uuids: Iterable[str]) -> bool:
        """Whether :meth:`in_mig_mode` answers for every one of these GPUs without asking the driver."""
        return all(u in self._mig_mode for u in gpu_uuids)

    def learn_modes(self, gpu_uuids: Iterable[str]) -> None:
        """Ask the driver for each GPU's mode not known yet (blocking: call it through ``to_thread``)."""
        for uuid in gpu_uuids:
            self.in_mig_mode(uuid)

    def in_mig_mode(self, gpu_uuid: str) -> bool:
        """Whether the GPU offers MIG profiles (asked once per GPU: the mode changes only with a reset)."""
        known = self._mig_mode.get(gpu_uuid)
        if known is None:
            known = self._mig_mode[gpu_uuid] = bool(self.control.profiles(gpu_uuid))
        return known

    def realise(self, pod_uid: str, reservations: Sequence[MigAllocation]) -> tuple[MigAllocation, ...]:
        """Create (or find) the instance of each reservation; MigRefused when the driver refuses one. The
        instances made before a refusal stay, owned by the pod: its retry reuses them, its end destroys them."""
        done = []
        for reservation in reservations:
            instance = self.control.create(reservation.gpu_uuid, reservation.profile, reservation.placement)
            key = (instance.gpu_uuid, instance.gpu_instance_id)
            self.created[key] = pod_uid
            self._unowned_since.pop(key, None)
            done.append(realised(reservation, instance))
        return tuple(done)

    def reclaim(self, pods: Iterable[PodLike], gone: Container[str]) -> list[Reclaimed]:
        """Destroy the instances no live pod owns (see the module's docstring); ``pods``: the node's pods as
        the synced watch holds them, ``gone``: UIDs of pods known to have ended. Returns what was destroyed."""
        owners: dict[_Slot, str] = {}  # slot -> UID of the live pod reserving it
        ended: dict[_Slot, tuple[str, str]] = {}  # slot -> (UID, "namespace/name") of an ended pod reserving it
        live: set[str] = set()
        for pod in pods:
            meta = pod.metadata
            value = meta.annotations.get(MIG_ALLOCATIONS)
            if value is None:
                continue
            try:
                reservations = decode_mig_allocations(value)
            except AnnotationError:
                continue  # the scheduler's to sort out; an instance it would own waits out the grace
            is_live = pod.status.phase not in _ENDED and meta.uid not in gone
            for r in reservations:
                if is_live:
                    owners[_slot_of(r)] = meta.uid
                else:
                    ended.setdefault(_slot_of(r), (meta.uid, f"{meta.namespace}/{meta.name}"))
            if is_live:
                live.add(meta.uid)
        now = self.clock()
        out: list[Reclaimed] = []
        present: set[tuple[str, int]] = set()
        for instance in self.control.instances():
            key = (instance.gpu_uuid, instance.gpu_instance_id)
            present.add(key)
            slot = _slot_of(instance)
            creator = self.created.get(key)
            if (slot in owners and creator in (None, owners[slot])) or (creator is not None and creator in live):
                self._unowned_since.pop(key, None)
                continue
            if creator is not None and creator in gone:
                reason = f"its pod (UID {creator}) ended"
            elif slot in ended and creator in (None, ended[slot][0]):
                reason = f"its pod {ended[slot][1]} ended"
            else:
                # Nobody here knows its pod: made before a restart, or by an Allocate whose pod the watch
                # does not show yet. Only the grace tells the two apart.
                since = self._unowned_since.setdefault(key, now)
                if now - since < self.grace:
                    continue
                reason = f"no live pod owns it (unowned for {now - since:.0f}s)"
            try:
                self.control.destroy(instance.gpu_uuid, instance.gpu_instance_id)
            except (HamiError, MigRefused, OSError) as err:  # e.g. still in use: the next pass tries again
                log.warning(
                    "cannot reclaim MIG instance %s on GPU %s (%s): %s",
                    instance.mig_uuid, instance.gpu_uuid, reason, err, extra={logkeys.NODE: self.node},
                )  # fmt: skip
                continue
            self.created.pop(key, None)
            self._unowned_since.pop(key, None)
            log.info(
                "reclaimed MIG instance %s (%s at slices %d+%d, GPU instance %d) on GPU %s: %s",
                instance.mig_uuid,
                instance.profile,
                instance.placement.start,
                instance.placement.size,
                instance.gpu_instance_id,
                instance.gpu_uuid,
                reason,
                extra={logkeys.NODE: self.node},
            )
            out.append(Reclaimed(instance, reason))
        # instances destroyed by someone else are forgotten
        self.created = {k: v for k, v in self.created.items() if k in present}
        self._unowned_since = {k: v for k, v in self._unowned_since.items() if k in present}
        return out
