"""``hami decode KEY VALUE``: show what a HAMi annotation (or label) value means, as JSON.

Every key of ``hami_common.annotations.keys`` has a decoder here (a test holds the two lists together). The
decoders are stricter than the services' readers: those skip what HAMi skips so that a tenant's junk never
fails scheduling, but an operator asking "what does this value mean" must hear that ``garbage`` means nothing.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Final

import msgspec

from hami_cli.helpfmt import DefaultsHelp
from hami_common import annotations as ann
from hami_common.annotations.registration import MODE_HAMI_CORE, MODE_MIG
from hami_common.errors import AnnotationError, InvalidInput
from hami_common.scheduling.policy import BINPACK, SPREAD, TOPOLOGY_AWARE, parse_bool, parse_scoring_weights
from hami_common.vendors import DeviceFamily, NodeView

__all__ = ["DECODERS", "all_decoders", "decode", "decode_main", "family_decoders", "parser"]

_TRACEPARENT: Final = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_DNS_SUBDOMAIN: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HANDSHAKE_LAYOUT: Final = "%Y-%m-%d %H:%M:%S"
_GRANT_VERSION: Final = "v1."
_GRANT_BYTES: Final = 32  # HMAC-SHA256


def _pod_devices(value: str, key: str) -> object:
    # HAMi skips a device segment without a "," silently; an operator is told it is not a device.
    for entry in value.split(";"):
        for segment in entry.split(":"):
            if segment.strip() and "," not in segment:
                raise AnnotationError(key, f"{segment!r} is not a device (UUID,type,memory,cores)")
    return [[dataclasses.asdict(d) for d in container] for container in ann.decode_pod_devices(value, key)]


def _node_lock(value: str, key: str) -> object:
    lock = ann.decode_node_lock(value, key)
    return {"locked_at": ann.encode_rfc3339(lock.locked_at), "namespace": lock.namespace, "name": lock.name}


def _unix_time(value: str, key: str) -> object:
    return ann.encode_rfc3339(ann.decode_unix_seconds(value, key))


def _handshake(value: str, key: str) -> object:
    state, sep, stamp = value.partition("_")
    if not sep or not state:
        raise AnnotationError(key, f"{value!r} is not STATE_YYYY-MM-DD HH:MM:SS")
    try:
        at = datetime.strptime(stamp, _HANDSHAKE_LAYOUT)
    except ValueError as err:
        raise AnnotationError(key, f"time {stamp!r} is not YYYY-MM-DD HH:MM:SS") from err
    return {"state": state, "time": at.strftime(_HANDSHAKE_LAYOUT)}


def _list(value: str, key: str) -> object:
    items = [item.strip() for item in value.split(",")]
    if not all(items):
        raise AnnotationError(key, f"{value!r} is not a comma-separated list of names")
    return items


def _one_of(*allowed: str) -> Callable[[str, str], object]:
    def decode(value: str, key: str) -> object:
        if value not in allowed:
            raise AnnotationError(key, f"{value!r} is none of {', '.join(allowed)}")
        return value

    return decode


def _bool(value: str, key: str) -> object:
    parsed = parse_bool(value)
    if parsed is None:
        raise AnnotationError(key, f"{value!r} is not a boolean (true, false, 1, 0, ...)")
    return parsed


def _name(value: str, key: str) -> object:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise AnnotationError(key, f"{value!r} is not a Kubernetes object name")
    return value


def _traceparent(value: str, key: str) -> object:
    match = _TRACEPARENT.match(value.strip())
    if match is None or set(match[2]) == {"0"} or set(match[3]) == {"0"}:
        raise AnnotationError(key, f"{value!r} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)")
    return {"version": match[1], "trace_id": match[2], "parent_id": match[3], "sampled": int(match[4], 16) & 1 == 1}


def _grant(value: str, key: str) -> object:
    if not value.startswith(_GRANT_VERSION):
        raise AnnotationError(key, f"{value!r} does not start with {_GRANT_VERSION!r}")
    body = value[len(_GRANT_VERSION) :]
    try:
        mac = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError) as err:
        raise AnnotationError(key, f"{body!r} is not base64url") from err
    if len(mac) != _GRANT_BYTES:
        raise AnnotationError(key, f"the signature has {len(mac)} bytes, not {_GRANT_BYTES}")
    # Only the holders of the grant key can verify it; decoding shows its form.
    return {"version": "v1", "hmac_sha256": mac.hex()}


def _weights(value: str, key: str) -> object:
    try:
        return dataclasses.asdict(parse_scoring_weights(value))
    except InvalidInput as err:
        raise AnnotationError(key, str(err)) from err


def _mig(value: str, key: str) -> object:
    return msgspec.to_builtins(ann.decode_mig_allocations(value, key))


Decoder = Callable[[str, str], object]
_DEVICE_LISTS: Final = ("-devices-allocated", "-devices-to-allocate")
_USE_KEY: Final = re.compile(r"/(no)?use-")

DECODERS: Final[dict[str, Decoder]] = {
    # node
    ann.NODE_REGISTER: lambda v, k: msgspec.to_builtins(ann.decode_node_devices(v, k)),
    ann.NODE_SCORE: lambda v, k: ann.decode_pair_scores(v, k),
    ann.NODE_HANDSHAKE: _handshake,
    ann.NODE_LOCK: _node_lock,
    ann.NODE_PLACEMENTS: _one_of(ann.NODE_PLACEMENTS_BUS),
    ann.DEVICE_CORDON: _list,
    # pod, written by the system
    ann.VGPU_NODE: _name,
    ann.VGPU_TIME: _unix_time,
    ann.DEVICES_TO_ALLOCATE: _pod_devices,
    ann.DEVICES_ALLOCATED: _pod_devices,
    ann.MIG_ALLOCATIONS: _mig,
    ann.BIND_TIME: _unix_time,
    ann.BIND_PHASE: _one_of(ann.BIND_PHASE_ALLOCATING, ann.BIND_PHASE_SUCCESS, ann.BIND_PHASE_FAILED),
    ann.TRACE_CONTEXT: _traceparent,
    ann.GRANT_SIGNATURE: _grant,
    # pod, set by users
    ann.NODE_SCHEDULER_POLICY: _one_of(BINPACK, SPREAD),
    ann.GPU_SCHEDULER_POLICY: _one_of(BINPACK, SPREAD, TOPOLOGY_AWARE),
    ann.DEVICE_SCORING_WEIGHTS: _weights,
    ann.USE_GPUTYPE: _list,
    ann.NOUSE_GPUTYPE: _list,
    ann.USE_GPUUUID: _list,
    ann.NOUSE_GPUUUID: _list,
    ann.NUMA_BIND: _bool,
    ann.VGPU_MODE: _one_of(MODE_HAMI_CORE, MODE_MIG),
    # labels
    ann.SCHEDULER_ROLE: _one_of(ann.SCHEDULER_ROLE_LEADER, ann.SCHEDULER_ROLE_FOLLOWER),
    ann.WEBHOOK_LABEL: _one_of(ann.WEBHOOK_IGNORE),
    ann.POD_GROUP_LABEL: _name,
    ann.ALLOW_DISABLE_CONTROL: _bool,
}


def _lock_time(value: str, key: str) -> object:
    """A vendor's node lock: HAMi's ``time,namespace,name`` form or a bare RFC 3339 time (Cambricon's)."""
    try:
        return _node_lock(value, key)
    except AnnotationError:
        return {"locked_at": ann.encode_rfc3339(ann.decode_rfc3339(value, key))}


def _word(value: str, key: str) -> object:
    if not value.strip() or not value.isprintable():
        raise AnnotationError(key, f"{value!r} is not a word")
    return value


def _registered(family: DeviceFamily) -> Decoder:
    def decode_register(value: str, key: str) -> object:
        try:
            devices = family.node_devices(NodeView(name="", annotations={key: value}))
        except InvalidInput as err:
            raise AnnotationError(key, str(err)) from err
        return [msgspec.to_builtins(dataclasses.asdict(d)) for d in devices]

    return decode_register


def family_decoders(families: Sequence[DeviceFamily]) -> dict[str, Decoder]:
    """The keys each device family reads or writes, found through the family port (no vendor is named here):
    its node registration, handshake and lock; the device lists a placement writes; the keys a tenant sets."""
    found: dict[str, Decoder] = {}
    for family in families:
        if family.register_key:
            found[family.register_key] = _registered(family)
        if family.handshake_key:
            found[family.handshake_key] = _handshake
        found.setdefault(family.node_lock.key, _lock_time)
        for key in family.owned_annotations:
            # HAMi's device-list form is every vendor's (EncodeContainerDevices); the rest are the system's words
            found[key] = _pod_devices if key.endswith(_DEVICE_LISTS) else _word
        for key in family.user_annotations:
            found[key] = _list if _USE_KEY.search(key) else _word
    return {k: v for k, v in found.items() if k not in DECODERS}


def all_decoders() -> dict[str, Decoder]:
    """HAMi's own keys and every shipped family's (with HAMi's chart defaults)."""
    from hami_cli.status import default_fleet  # the families as `hami status` reads a cluster

    return {**DECODERS, **family_decoders(default_fleet().families)}


def decode(key: str, value: str, decoders: Mapping[str, Decoder] | None = None) -> bytes:
    """The decoded value as indented JSON; ``AnnotationError`` for a malformed value, KeyError for a key."""
    table = DECODERS if decoders is None else decoders
    return msgspec.json.format(msgspec.json.encode(table[key](value, key)), indent=2)


def parser(decoders: Mapping[str, Decoder] | None = None) -> argparse.ArgumentParser:
    decoders = all_decoders() if decoders is None else decoders
    parser = argparse.ArgumentParser(
        formatter_class=DefaultsHelp,
        prog="hami decode",
        description="Explain a HAMi annotation or label value as JSON; a value that does not parse fails (rc 1) "
        "with the reason.",
        epilog="keys: " + ", ".join(sorted(decoders)),
    )
    parser.add_argument("key", choices=sorted(decoders), metavar="KEY", help="the annotation or label key")
    parser.add_argument("value", metavar="VALUE")
    return parser


def decode_main(argv: Sequence[str]) -> int:
    decoders = all_decoders()
    parsed = parser(decoders).parse_args(argv)
    try:
        sys.stdout.write(decode(parsed.key, parsed.value, decoders).decode() + "\n")
    except AnnotationError as err:
        print(f"hami decode: {err}", file=sys.stderr)
        return 1
    return 0
