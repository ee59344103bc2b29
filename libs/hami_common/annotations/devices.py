"""The pod device lists ``hami.io/vgpu-devices-to-allocate`` and ``…-allocated`` (hami-protocol §2.5).

Grammar: a device is ``UUID,TYPE,MEM,CORES`` terminated by ``:``; a container is a run of devices
terminated by ``;``; containers are listed init containers first, a container without a GPU is a bare
``;``. Decoding keeps empty entries and, like HAMi, the trailing ``;`` yields one extra empty container.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from hami_common.annotations.keys import DEVICES_TO_ALLOCATE
from hami_common.errors import AnnotationError

__all__ = [
    "ContainerDevice",
    "ContainerDevices",
    "PodDevices",
    "decode_pod_devices",
    "encode_pod_devices",
    "pop_first_container",
]

DEVICE_END: Final = ":"
CONTAINER_END: Final = ";"
FIELD_SEP: Final = ","
# HAMi's own message for fewer than four fields (HAMi: pkg/device/devices.go:507-509).
MISSING_FIELDS: Final = "pod annotation format error, missing fields, do not use nodeName in task spec"
_FORBIDDEN: Final = frozenset(DEVICE_END + CONTAINER_END + FIELD_SEP)


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One physical GPU granted to one container: MiB and core percentage of that card."""

    uuid: str
    type: str
    usedmem: int
    usedcores: int


ContainerDevices = tuple[ContainerDevice, ...]
PodDevices = tuple[ContainerDevices, ...]


def _check_encodable(dev: ContainerDevice) -> None:
    for text in (dev.uuid, dev.type):
        if not text or _FORBIDDEN & set(text):
            raise ValueError(f"device field {text!r} is empty or holds one of ':;,'")
    if dev.usedmem < 0 or dev.usedcores < 0:
        raise ValueError(f"device {dev.uuid} has negative usage")


def encode_pod_devices(containers: Sequence[Sequence[ContainerDevice]]) -> str:
    """Encode per-container device lists, init containers first, exactly as HAMi writes them."""
    parts: list[str] = []
    for devices in containers:
        for dev in devices:
            _check_encodable(dev)
            parts.append(f"{dev.uuid},{dev.type},{dev.usedmem},{dev.usedcores}{DEVICE_END}")
        parts.append(CONTAINER_END)
    return "".join(parts)


def _decode_int(text: str, what: str, key: str) -> int:
    stripped = text.strip()
    if not stripped.isdigit() or not stripped.isascii():
        raise AnnotationError(key, f"{what} {text!r} is not a non-negative integer")
    return int(stripped)


def _decode_device(segment: str, key: str) -> ContainerDevice:
    fields = segment.split(FIELD_SEP)
    if len(fields) < 4:
        raise AnnotationError(key, f"{MISSING_FIELDS}: {segment!r}")
    uuid, vendor = fields[0].strip(), fields[1].strip()
    if not uuid:
        raise AnnotationError(key, f"empty device UUID in {segment!r}")
    return ContainerDevice(
        uuid=uuid,
        type=vendor,
        usedmem=_decode_int(fields[2], "memory", key),
        usedcores=_decode_int(fields[3], "cores", key),
    )


def decode_pod_devices(value: str, key: str = DEVICES_TO_ALLOCATE) -> PodDevices:
    """Decode a device list. ``key`` only names the annotation in error messages.

    Like HAMi, segments without a ``,`` are skipped and the trailing ``;`` gives an extra empty entry;
    an empty value decodes to one empty container, as Go's ``strings.Split("", ";")`` gives HAMi one
    (HAMi: pkg/device/devices.go ``DecodePodDevices``). Callers treat empty entries as "no GPU".
    """
    return tuple(
        tuple(_decode_device(seg, key) for seg in entry.split(DEVICE_END) if FIELD_SEP in seg)
        for entry in value.split(CONTAINER_END)
    )


def pop_first_container(containers: PodDevices) -> tuple[ContainerDevices, PodDevices]:
    """Take the first non-empty container entry, as the device plugin does on each Allocate.

    Returns the entry and the list with that entry now empty (HAMi: .../plugin/util.go:112-144). With no
    non-empty entry left, returns ``((), containers)``.
    """
    for i, devices in enumerate(containers):
        if devices:
            return devices, (*containers[:i], (), *containers[i + 1 :])
    return (), containers
