"""What is used on each node and card (hami-protocol §4.4 step 4, §4.9).

Values are immutable: a fit works on copies (``with_grant``), and the ledger that owns the real usage
replaces a node's :class:`NodeUsage` whole when a pod comes or goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hami_common.annotations.devices import ContainerDevice
from hami_common.annotations.mig import MigAllocation
from hami_common.annotations.registration import MODE_MIG, DeviceInfo, MigProfile
from hami_common.scheduling.mig import AllowlistEntry, BookedInstance, allowed_profiles

__all__ = [
    "DeviceCharge",
    "DeviceUsage",
    "NodeUsage",
    "apply_charges",
    "collapse_devices",
    "device_usage_from",
]


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One physical card: what it offers and what is booked on it. HAMi's ``DeviceUsage``."""

    id: str
    index: int
    count: int  # vGPU slots
    totalmem: int  # MiB
    totalcore: int
    type: str
    numa: int = 0
    health: bool = True
    mode: str = "hami-core"
    used: int = 0
    usedmem: int = 0
    usedcores: int = 0
    network_id: int | None = None  # Ascend 910's HCCS group (custominfo.NetworkID); None where not registered
    mig_profiles: tuple[MigProfile, ...] = ()  # MIG mode: the allowed profiles it offers, smallest first
    mig_instances: tuple[BookedInstance, ...] = ()  # MIG mode: the instances booked on it

    @property
    def is_mig(self) -> bool:
        return self.mode == MODE_MIG

    @property
    def free_memory(self) -> int:
        return self.totalmem - self.usedmem

    @property
    def has_free_slot(self) -> bool:
        return self.count > self.used

    def with_grant(
        self, usedmem: int, usedcores: int, slots: int = 1, instance: BookedInstance | None = None
    ) -> DeviceUsage:
        return replace(
            self,
            used=self.used + slots,
            usedmem=self.usedmem + usedmem,
            usedcores=self.usedcores + usedcores,
            mig_instances=self.mig_instances if instance is None else _in_order((*self.mig_instances, instance)),
        )

    def with_instances(self, instances: Iterable[BookedInstance], sign: int = 1) -> DeviceUsage:
        """The card with MIG instances booked (``sign=1``) or released (``sign=-1``, each one once)."""
        if sign > 0:
            return replace(self, mig_instances=_in_order((*self.mig_instances, *instances)))
        left = list(self.mig_instances)
        for instance in instances:
            if instance in left:
                left.remove(instance)
        return replace(self, mig_instances=tuple(left))


def _in_order(instances: Iterable[BookedInstance]) -> tuple[BookedInstance, ...]:
    # one order whatever the order of bookings, so a ledger rebuilt after a restart equals the one kept
    return tuple(sorted(instances, key=lambda i: (i.placement.start, i.placement.size, i.profile)))


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """A registered node: its cards in registration order, pair scores and cordoned cards."""

    name: str
    devices: tuple[DeviceUsage, ...]
    pair_scores: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    cordoned: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class DeviceCharge:
    """One pod's collapsed booking on one card (§4.9): the slots, MiB and cores it holds."""

    uuid: str
    type: str
    usedmem: int
    usedcores: int
    slots: int = 1  # 0 only for a card where the pod holds MIG instances and nothing else (see collapse_devices)
    instances: tuple[BookedInstance, ...] = ()  # the MIG instances it holds on the card


def device_usage_from(info: DeviceInfo, mig_allowlist: Sequence[AllowlistEntry] = ()) -> DeviceUsage:
    """An idle card from its registration entry; a MIG card keeps the profiles ``mig_allowlist`` allows."""
    mode = info.mode or "hami-core"
    return DeviceUsage(
        id=info.id,
        index=info.index,
        count=info.count,
        totalmem=info.devmem,
        totalcore=info.devcore,
        type=info.type,
        numa=info.numa,
        health=info.health,
        mode=mode,
        mig_profiles=allowed_profiles(info.mig_profiles, mig_allowlist, info.type) if mode == MODE_MIG else (),
    )


def collapse_devices(
    init: Sequence[Sequence[ContainerDevice]],
    app: Sequence[Sequence[ContainerDevice]],
    mig: Iterable[MigAllocation] = (),
) -> tuple[DeviceCharge, ...]:
    """HAMi's init-container collapsing, per card UUID, sorted by UUID (hami-protocol §4.9).

    Init containers run one at a time, so they contribute their peak (memory and cores separately, one
    slot); app containers run together, so they add up. The booking is the larger of the two per field,
    with at least one slot.

    ``mig`` are the pod's MIG reservations: each charge carries the instances on its card. An instance
    lives as long as its pod (the allocator destroys it when the pod ends), so one whose container no longer
    counts, a finished init container's, still holds its slices: a card where only such instances remain
    gets a charge of no memory, no cores and no slot.
    """
    instances: dict[str, list[BookedInstance]] = {}
    for allocation in mig:
        instances.setdefault(allocation.gpu_uuid, []).append(
            BookedInstance(profile=allocation.profile, placement=allocation.placement)
        )
    init_peak: dict[str, list[int]] = {}
    app_sum: dict[str, list[int]] = {}
    types: dict[str, str] = {}
    for devices in init:
        for d in devices:
            peak = init_peak.setdefault(d.uuid, [0, 0])
            peak[0] = max(peak[0], d.usedmem)
            peak[1] = max(peak[1], d.usedcores)
            types.setdefault(d.uuid, d.type)
    for devices in app:
        for d in devices:
            total = app_sum.setdefault(d.uuid, [0, 0, 0])
            total[0] += d.usedmem
            total[1] += d.usedcores
            total[2] += 1
            types.setdefault(d.uuid, d.type)
    charges = []
    for uuid in sorted(types):
        i_mem, i_cores = init_peak.get(uuid, (0, 0))
        a_mem, a_cores, a_slots = app_sum.get(uuid, (0, 0, 0))
        i_slots = 1 if uuid in init_peak else 0
        charges.append(
            DeviceCharge(
                uuid=uuid,
                type=types[uuid],
                usedmem=max(i_mem, a_mem),
                usedcores=max(i_cores, a_cores),
                slots=max(i_slots, a_slots, 1),
                instances=tuple(instances.get(uuid, ())),
            )
        )
    for uuid in sorted(instances.keys() - types.keys()):
        charges.append(
            DeviceCharge(uuid=uuid, type="", usedmem=0, usedcores=0, slots=0, instances=tuple(instances[uuid]))
        )
    if len(charges) > len(types):
        charges.sort(key=lambda c: c.uuid)
    return tuple(charges)


def apply_charges(node: NodeUsage, charges: Iterable[DeviceCharge], sign: int = 1) -> NodeUsage:
    """The node with charges added (``sign=1``) or removed (``sign=-1``); unknown cards are ignored."""
    by_uuid: dict[str, list[int]] = {}
    held: dict[str, list[BookedInstance]] = {}
    for c in charges:
        acc = by_uuid.setdefault(c.uuid, [0, 0, 0])
        acc[0] += 0 if c.slots == 0 and c.instances else max(c.slots, 1)
        acc[1] += c.usedmem
        acc[2] += c.usedcores
        if c.instances:
            held.setdefault(c.uuid, []).extend(c.instances)
    if not by_uuid:
        return node
    devices = tuple(
        d if d.id not in by_uuid else _charged(d, by_uuid[d.id], held.get(d.id), sign) for d in node.devices
    )
    return replace(node, devices=devices)


def _charged(d: DeviceUsage, acc: list[int], instances: list[BookedInstance] | None, sign: int) -> DeviceUsage:
    d = replace(
        d,
        used=d.used + sign * acc[0],
        usedmem=d.usedmem + sign * acc[1],
        usedcores=d.usedcores + sign * acc[2],
    )
    return d if instances is None else d.with_instances(instances, sign)
