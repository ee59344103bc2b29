"""A pod's usage of each GPU as HAMi's scheduler cache counts it (hami-protocol §4.9)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hami_common.events import ContainerPlacement

__all__ = ["PodDevice", "collapse"]


@dataclass(frozen=True, slots=True)
class PodDevice:
    """A pod's collapsed usage of one GPU: what HAMi's scheduler cache counts against the device."""

    uuid: str
    usedmem_mib: int
    usedcores: int
    slots: int
    series: tuple[str, ...] = ()  # namespace, node, pod, container index, uuid: built once per placement


def collapse(containers: Iterable[ContainerPlacement]) -> tuple[PodDevice, ...]:
    """One entry per GPU, as HAMi's scheduler cache counts a pod (hami-protocol §4.9).

    Init containers run one after another, so their peak counts (slots 1); app containers run together,
    so they add up (one slot each); the device is charged the larger of the two, field by field.
    """
    init: dict[str, tuple[int, int]] = {}
    app: dict[str, tuple[int, int, int]] = {}
    for ctr in containers:
        for dev in ctr.devices:
            if ctr.init:
                mem, cores = init.get(dev.uuid, (0, 0))
                init[dev.uuid] = (max(mem, dev.usedmem_mib), max(cores, dev.usedcores))
            else:
                mem, cores, slots = app.get(dev.uuid, (0, 0, 0))
                app[dev.uuid] = (mem + dev.usedmem_mib, cores + dev.usedcores, slots + 1)
    out = []
    for uuid in sorted(init.keys() | app.keys()):
        init_mem, init_cores = init.get(uuid, (0, 0))
        app_mem, app_cores, app_slots = app.get(uuid, (0, 0, 0))
        init_slots = 1 if uuid in init else 0
        out.append(
            PodDevice(
                uuid=uuid,
                usedmem_mib=max(init_mem, app_mem),
                usedcores=max(init_cores, app_cores),
                slots=max(init_slots, app_slots, 1),
            )
        )
    return tuple(out)
