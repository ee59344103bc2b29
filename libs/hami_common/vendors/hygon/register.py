"""The register annotation ``hami.io/node-dcu-register`` (hami-vendors §3.2): HAMi's legacy colon form.

``id,count,devmem,devcore,type,numa,health[,index,mode]`` per card, each card ended by ``:``. dcu-dp writes
the 9-field form (``DCU-<serial>,4,<MiB>,100,DCU-<model>,0,true,<index>,hami:``); 7 fields mean index 0 and
mode ``hami-core``. Errors, as HAMi words them: no ``:`` at all, a segment without ``,`` (``malformed node
annotation segment``), any field count but 7 or 9 (``unexpected field count <n> in node annotation``), a
negative number, and no card at all (``no gpu found on node``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from hami_common.annotations.registration import DeviceInfo, decode_legacy_node_devices
from hami_common.errors import AnnotationError
from hami_common.vendors.hygon.keys import NODE_REGISTER

__all__ = ["decode_register", "encode_register"]

_FORBIDDEN: Final = frozenset(",:")


def decode_register(value: str | None, key: str = NODE_REGISTER) -> tuple[DeviceInfo, ...]:
    """The node's DCUs; AnnotationError naming ``key`` when absent or malformed (never another exception)."""
    if value is None:
        raise AnnotationError(key, f"annos not found {key}")
    if ":" not in value:
        raise AnnotationError(key, f"no device separator ':' in {value!r}")
    devices = decode_legacy_node_devices(value, key)
    if not devices:
        raise AnnotationError(key, "no gpu found on node")
    return devices


def encode_register(devices: Sequence[DeviceInfo]) -> str:
    """dcu-dp's 9-field form, every card ended by ``:``; ValueError for a field that cannot be written."""
    parts: list[str] = []
    for d in devices:
        for text in (d.id, d.type, d.mode):
            if not text or _FORBIDDEN & set(text):
                raise ValueError(f"register field {text!r} is empty or holds ',' or ':'")
        health = "true" if d.health else "false"
        parts.append(f"{d.id},{d.count},{d.devmem},{d.devcore},{d.type},{d.numa},{health},{d.index},{d.mode}:")
    return "".join(parts)
