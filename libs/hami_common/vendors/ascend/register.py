"""The Ascend node registration ``hami.io/node-register-<CommonWord>`` (hami-vendors §1.2).

A JSON array of HAMi's ``DeviceInfo``, every field omitempty, written by the Ascend device plugin. HAMi
decodes it with Go's ``encoding/json``, which matches object keys to fields **case-insensitively** (the
upstream test registers ``{"ID": …, "Count": …, "Devmem": …}``); we fold keys the same way, the last of two
spellings winning as in Go. ``custominfo`` is a free map whose keys are *not* folded: only an exact
``NetworkID`` holding a JSON number is the card's HCCS group.

Errors are HAMi's texts in an :class:`AnnotationError`: a missing key is ``annos not found <key>``, an empty
array ``no device found on node``, anything that does not decode ``failed to unmarshal node devices: …``.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

from hami_common.errors import AnnotationError
from hami_common.vendors.ascend.keys import ASCEND_910_PREFIX, ASCEND_910C, NETWORK_ID, register_key

__all__ = ["RegisteredNpu", "decode_register", "encode_register", "plugin_network_id"]

_Int32 = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]


class RegisteredNpu(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One NPU as the plugin registers it; field names and order are HAMi's JSON."""

    id: str = ""
    index: _Int32 = 0
    count: _Int32 = 0
    devmem: _Int32 = 0
    devcore: _Int32 = 0
    type: str = ""
    numa: _Int32 = 0
    mode: str = ""
    health: bool = False
    custominfo: dict[str, Any] | None = None

    @property
    def network_id(self) -> int | None:
        """``custominfo.NetworkID`` when it is a JSON number (HAMi reads it as a float and truncates)."""
        if self.custominfo is None:
            return None
        value = self.custominfo.get(NETWORK_ID)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return int(value)


_FIELDS: Final = {name.casefold(): name for name in RegisteredNpu.__struct_fields__}
_ENCODER: Final = msgspec.json.Encoder()


def _fold(item: object, key: str) -> dict[str, object]:
    if not isinstance(item, dict):
        raise AnnotationError(
            key, f"failed to unmarshal node devices: a device is {type(item).__name__}, not an object"
        )
    folded: dict[str, object] = {}
    for name, value in item.items():
        field = _FIELDS.get(name.casefold())
        if field is not None:  # Go ignores keys that name no field
            folded[field] = value
    return folded


def decode_register(value: str | None, word: str) -> tuple[RegisteredNpu, ...]:
    """Decode ``word``'s register annotation (``None`` when the node has none)."""
    key = register_key(word)
    if value is None:
        raise AnnotationError(key, f"annos not found {key}")
    try:
        raw = msgspec.json.decode(value)
    except (msgspec.DecodeError, RecursionError) as err:  # RecursionError: nesting deeper than msgspec allows
        raise AnnotationError(key, f"failed to unmarshal node devices: {err}") from err
    if not isinstance(raw, list):
        raise AnnotationError(key, f"failed to unmarshal node devices: expected an array, got {type(raw).__name__}")
    try:
        devices = tuple(msgspec.convert(_fold(item, key), RegisteredNpu) for item in raw)
    except (msgspec.ValidationError, RecursionError) as err:
        raise AnnotationError(key, f"failed to unmarshal node devices: {err}") from err
    if not devices:
        raise AnnotationError(key, "no device found on node")
    for dev in devices:
        # HAMi would accept an empty id; every later step (device lists, Allocate) keys on it, so refuse here.
        if not dev.id:
            raise AnnotationError(key, "failed to unmarshal node devices: a device has no id")
    return devices


def encode_register(devices: tuple[RegisteredNpu, ...]) -> str:
    """The plugin's JSON: lowercase keys, zero fields left out (for tests and the emulator)."""
    return _ENCODER.encode(devices).decode()


_HCCS_GROUP_SIZE: Final = 4  # an 8-NPU 910 board is two 4-NPU HCCS rings


def plugin_network_id(word: str, index: int) -> int | None:
    """The NetworkID the Ascend device plugin registers for the NPU at list position ``index``
    (ascend-dp: internal/server/register.go:129-140): none for non-910 models, always 0 on 910C (one
    SuperPod fabric), else 0 for positions 0-3 and 1 from 4 on."""
    if not word.startswith(ASCEND_910_PREFIX):
        return None
    if word == ASCEND_910C:
        return 0
    return 0 if index < _HCCS_GROUP_SIZE else 1
