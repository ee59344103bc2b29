"""What is used on each node and card (hami-protocol §4.4 step 4, §4.9).

Values are immutable: a fit works on copies (``with_grant``), and the ledger that owns the real usage
replaces a node's :class:`NodeUsage` whole when a pod comes or goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hami_common.annotations.devices import ContainerDevice
from hami_common.annotations.registration import DeviceInfo

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

    @property
    def free_memory(self) -> int:
        return self.totalmem - self.usedmem

    @property
    def has_free_slot(self) -> bool:
        return self.count > self.used

    def with_grant(self, usedmem: int, usedcores: int, slots: int = 1) -> DeviceUsage:
        return replace(
            self, used=self.used + slots, usedmem=self.usedmem + usedmem, usedcores=self.usedcores + usedcores
        )


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
    slots: int = 1


def device_usage_from(info: DeviceInfo) -> DeviceUsage:
    """An idle card from its registration entry."""
    return DeviceUsage(
        id=info.id,
        index=info.index,
        count=info.count,
        totalmem=info.devmem,
        totalcore=info.devcore,
        type=info.type,
        numa=info.numa,
        health=info.health,
        mode=info.mode or "hami-core",
    )


def collapse_devices(
    init: Sequence[Sequence[ContainerDevice]], app: Sequence[Sequence[ContainerDevice]]
) -> tuple[DeviceCharge, ...]:
    """HAMi's init-container collapsing, per card UUID, sorted by UUID (hami-protocol §4.9).

    Init containers run one at a time, so they contribute their peak (memory and cores separately, one
    slot); app containers run together, so they add up. The booking is the larger of the two per field,
    with at least one slot.
    """
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
            )
        )
    return tuple(charges)


def apply_charges(node: NodeUsage, charges: Iterable[DeviceCharge], sign: int = 1) -> NodeUsage:
    """The node with charges added (``sign=1``) or removed (``sign=-1``); unknown cards are ignored."""
    by_uuid: dict[str, list[int]] = {}
    for c in charges:
        acc = by_uuid.setdefault(c.uuid, [0, 0, 0])
        acc[0] += max(c.slots, 1)
        acc[1] += c.usedmem
        acc[2] += c.usedcores
    if not by_uuid:
        return node
    devices = tuple(
        d
        if d.id not in by_uuid
        else replace(
            d,
            used=d.used + sign * by_uuid[d.id][0],
            usedmem=d.usedmem + sign * by_uuid[d.id][1],
            usedcores=d.usedcores + sign * by_uuid[d.id][2],
        )
        for d in node.devices
    )
    return replace(node, devices=devices)
