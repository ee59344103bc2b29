"""The node registration ``hami.io/node-nvidia-register`` (hami-protocol §2.2).

Since HAMi v2.8 it is a JSON array of ``DeviceInfo`` whose every field is omitempty: index 0, NUMA 0,
an empty mode and ``health: false`` are left out, so **an absent ``health`` means unhealthy**. The older
colon form is decoded for other vendors and HAMi < 2.8, never written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Final

import msgspec

from hami_common.annotations.keys import MODE_HAMI_CORE, MODE_MIG, NODE_REGISTER
from hami_common.errors import AnnotationError

__all__ = [
    "MODE_HAMI_CORE",
    "MODE_MIG",
    "DeviceInfo",
    "MigPlacement",
    "MigProfile",
    "decode_legacy_node_devices",
    "decode_node_devices",
    "encode_node_devices",
]

NonNegative = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]


class MigPlacement(msgspec.Struct, frozen=True, kw_only=True):
    start: NonNegative = 0
    size: NonNegative = 0


class MigProfile(
    msgspec.Struct, frozen=True, kw_only=True, rename={"memory_mb": "memoryMB", "slice_count": "sliceCount"}
):
    """A MIG profile a GPU offers; HAMi never serialises its InstanceCount."""

    name: str = ""
    memory_mb: NonNegative = 0
    core: NonNegative = 0
    slice_count: NonNegative = 0
    placements: tuple[MigPlacement, ...] = ()


class DeviceInfo(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    omit_defaults=True,
    rename={"mig_profiles": "migProfiles"},
):
    """One physical GPU as a node registers it. Field order and names are HAMi's JSON."""

    id: str = ""
    index: NonNegative = 0
    count: NonNegative = 0
    devmem: NonNegative = 0
    devcore: NonNegative = 0
    type: str = ""
    numa: NonNegative = 0
    mode: str = ""
    mig_profiles: tuple[MigProfile, ...] = ()
    health: bool = False


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(tuple[DeviceInfo, ...])


def encode_node_devices(devices: Sequence[DeviceInfo]) -> str:
    """HAMi's v2.8+ JSON, byte for byte: omitted zero fields, no spaces."""
    return _ENCODER.encode(tuple(devices)).decode()


def decode_node_devices(value: str, key: str = NODE_REGISTER) -> tuple[DeviceInfo, ...]:
    """Decode the JSON registration; unknown fields are ignored, wrong types and negatives rejected."""
    try:
        devices = _DECODER.decode(value)
    except msgspec.DecodeError as err:  # ValidationError is a DecodeError
        raise AnnotationError(key, f"not a valid device registration: {err}") from err
    for dev in devices:
        if not dev.id:
            raise AnnotationError(key, "a device has no id")
    return devices


_LEGACY_SHORT: Final = 7  # id,count,devmem,devcore,type,numa,health
_LEGACY_LONG: Final = 9  # ... ,index,mode


def _legacy_int(text: str, field: str, key: str) -> int:
    try:
        number = int(text.strip())
    except ValueError as err:
        raise AnnotationError(key, f"{field} field is not an integer: {text!r}") from err
    if number < 0:
        raise AnnotationError(key, f"{field} field must not be negative: {number}")
    return number


def _legacy_bool(text: str, key: str) -> bool:
    # Go's strconv.ParseBool accepts exactly these spellings.
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise AnnotationError(key, f"health field is not a boolean: {text!r}")


def decode_legacy_node_devices(value: str, key: str = NODE_REGISTER) -> tuple[DeviceInfo, ...]:
    """Decode the colon form ``id,count,devmem,devcore,type,numa,health[,index,mode]:…``.

    Empty segments are skipped, so ``":"`` is no device and no error (HAMi: pkg/device/devices.go:317-417).
    """
    devices: list[DeviceInfo] = []
    for segment in value.split(":"):
        if not segment:
            continue
        if "," not in segment:
            raise AnnotationError(key, f'malformed node annotation segment: "{segment}"')
        fields = segment.split(",")
        if len(fields) not in (_LEGACY_SHORT, _LEGACY_LONG):
            raise AnnotationError(key, f"unexpected field count {len(fields)} in node annotation")
        index, mode = 0, MODE_HAMI_CORE
        if len(fields) == _LEGACY_LONG:
            index = _legacy_int(fields[7], "index", key)
            mode = fields[8].strip() or MODE_HAMI_CORE
        devices.append(
            DeviceInfo(
                id=fields[0].strip(),
                count=_legacy_int(fields[1], "count", key),
                devmem=_legacy_int(fields[2], "devmem", key),
                devcore=_legacy_int(fields[3], "devcore", key),
                type=fields[4],
                numa=_legacy_int(fields[5], "numa", key),
                health=_legacy_bool(fields[6].strip(), key),
                index=index,
                mode=mode,
            )
        )
    return tuple(devices)
