"""The scheduler's proof that it made a grant (``hami.io/vgpu-grant``).

A pod's author controls its annotations wherever admission does not stop them (a skipped or failed-open
webhook, an older policy). HAMi's device plugin serves whatever ``hami.io/vgpu-devices-to-allocate`` says
(HAMi#3041), so a pod carrying a forged list and a ``spec.nodeName`` runs with any limit it likes. Here the
extender signs each grant it writes with a key that only it and the node services hold (a Secret mounted
into the scheduler pod and the node DaemonSet), and the allocator serves an annotation-only allocation
only when the signature verifies for that pod UID, that node and that device list.

The signature is ``v1.`` + base64url(HMAC-SHA256(key, "hami-grant-v1" NUL uid NUL node NUL devices)),
``devices`` being the exact ``hami.io/vgpu-devices-allocated`` value. The UID binds it to one pod object (a
copy onto another pod does not verify), the node to one node.

A MIG grant also carries ``hami.io/vgpu-mig-allocations``, whose profile and placement decide which instance
the device plugin creates. The scheduler writes that part, the device plugin adds each entry's runtime ids
(``migUUID``, ``gpuInstanceID``, ``computeInstanceID``) after Allocate, so the signature covers exactly the
scheduler-written fields (containerIndex, deviceIndex, gpuUUID, profile, placement), in the annotation's
order: a legitimately patched annotation still verifies, a changed profile or placement does not. Such a
grant is signed over a different domain, ``"hami-grant-v1-mig"``, with the four fields as one JSON array,
so no value can be moved from one field into another, and a MIG grant can never pass for a plain one (or
the other way round) by adding or dropping the annotation.

A pod given devices of other families (Ascend, Cambricon, Hygon, …) carries each family's own
``…-devices-allocated`` list beside NVIDIA's (or alone). Its signature covers those lists too, over the
domain ``"hami-grant-v1-families"`` with ``[uid, node, devices, mig part, [[key, value], …]]`` (keys sorted)
as one JSON array: no family's list can be changed, added or dropped while NVIDIA's still verifies. The
verifier finds them by their key's ending (:data:`FAMILY_LIST_SUFFIX`), so it needs no family's
configuration. A grant without family lists is signed exactly as before. (HAMi's vendor device plugins
do not check the signature; it protects whatever allocator does, ours for NVIDIA.)
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import msgspec

from hami_common.annotations import (
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    GRANT_SIGNATURE,
    MIG_ALLOCATIONS,
    VGPU_NODE,
    MigAllocation,
    decode_mig_allocations,
    decode_pod_devices,
)
from hami_common.errors import AnnotationError, InvalidInput
from hami_common.settings import setting

__all__ = [
    "FAMILY_LIST_SUFFIX",
    "MIN_KEY_BYTES",
    "GrantKey",
    "GrantSettings",
    "family_lists",
    "mig_signed_part",
    "unverified_reason",
]

MIN_KEY_BYTES: Final = 32
_VERSION: Final = "v1."
_DOMAIN: Final = b"hami-grant-v1"
_MIG_DOMAIN: Final = b"hami-grant-v1-mig"
_FAMILIES_DOMAIN: Final = b"hami-grant-v1-families"
# Every family's placement list ends so (HAMi's hami.io/<vendor>-devices-allocated); NVIDIA's is left out.
FAMILY_LIST_SUFFIX: Final = "-devices-allocated"
_JSON: Final = msgspec.json.Encoder()

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GrantKey:
    """The shared HMAC key. ``repr`` never shows it."""

    secret: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.secret) < MIN_KEY_BYTES:
            raise InvalidInput(f"grant key: {len(self.secret)} bytes, at least {MIN_KEY_BYTES} are needed")

    @classmethod
    def load(cls, path: str | Path) -> GrantKey:
        """The key file's content, surrounding whitespace stripped (a Secret's value, often with a newline)."""
        try:
            secret = Path(path).read_bytes().strip()
        except OSError as err:
            raise InvalidInput(f"grant key file {path}: {err.strerror or err}") from err
        return cls(secret)

    def sign(
        self,
        uid: str,
        node: str,
        devices: str,
        mig: Sequence[MigAllocation] = (),
        families: Mapping[str, str] | None = None,
    ) -> str:
        """The signature of a grant; ``mig``: the pod's MIG reservations (only their scheduler-written fields
        are signed, so passing them before or after the device plugin added its runtime ids is the same);
        ``families``: the other families' lists (:func:`family_lists` of the annotations written)."""
        mac = self._mac(uid, node, devices, mig, families or {})
        return _VERSION + base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def verifies(
        self,
        signature: str,
        uid: str,
        node: str,
        devices: str,
        mig: Sequence[MigAllocation] = (),
        families: Mapping[str, str] | None = None,
    ) -> bool:
        if not signature.startswith(_VERSION):
            return False
        expected = self.sign(uid, node, devices, mig, families)
        return hmac.compare_digest(expected.encode(), signature.encode())

    def _mac(
        self, uid: str, node: str, devices: str, mig: Sequence[MigAllocation], families: Mapping[str, str]
    ) -> bytes:
        if families:
            lists = sorted([k, v] for k, v in families.items())
            message = b"\0".join((_FAMILIES_DOMAIN, _JSON.encode([uid, node, devices, mig_signed_part(mig), lists])))
        elif mig:
            message = b"\0".join((_MIG_DOMAIN, _JSON.encode([uid, node, devices, mig_signed_part(mig)])))
        else:  # unchanged since before MIG: grants signed by an older scheduler still verify
            message = b"\0".join((_DOMAIN, uid.encode(), node.encode(), devices.encode()))
        return hmac.new(self.secret, message, hashlib.sha256).digest()


def mig_signed_part(mig: Sequence[MigAllocation]) -> list[tuple[int, int, str, str, int, int]]:
    """The scheduler-written fields of each reservation, in order: what a MIG grant's signature covers."""
    return [
        (m.container_index, m.device_index, m.gpu_uuid, m.profile, m.placement.start, m.placement.size) for m in mig
    ]


@dataclasses.dataclass(frozen=True)  # no slots: combined with other settings bases
class GrantSettings:
    """Where the extender and the allocators find the shared key."""

    grant_key_file: str = setting(
        "",
        "file holding the grant-signing key shared by the extender and the allocators (empty: none; the "
        "extender then writes unsigned grants and the allocator serves staged allocations only)",
    )

    def grant_key(self) -> GrantKey | None:
        """The key, or None when no file is set; a file that is set but unusable raises InvalidInput."""
        return GrantKey.load(self.grant_key_file) if self.grant_key_file else None


def family_lists(annotations: Mapping[str, str]) -> dict[str, str]:
    """The other device families' placement lists among ``annotations`` (what a signature covers)."""
    return {k: v for k, v in annotations.items() if k.endswith(FAMILY_LIST_SUFFIX) and k != DEVICES_ALLOCATED}


def unverified_reason(key: GrantKey | None, uid: str, annotations: Mapping[str, str]) -> str:
    """Why the pod's annotation grant must not be served; empty when it may.

    It may when the signature verifies over the pod's UID, ``hami.io/vgpu-node``,
    ``hami.io/vgpu-devices-allocated`` and the scheduler-written part of ``hami.io/vgpu-mig-allocations`` (when
    present), and every entry left in ``hami.io/vgpu-devices-to-allocate`` is the signed entry at the same
    place (the device plugin only empties entries as it serves them).
    """
    if key is None:
        return "no grant key is configured, so annotation-only allocations are refused"
    signature = annotations.get(GRANT_SIGNATURE, "")
    node = annotations.get(VGPU_NODE, "")
    allocated = annotations.get(DEVICES_ALLOCATED, "")
    if not signature:
        return f"the grant carries no {GRANT_SIGNATURE} signature"
    mig: tuple[MigAllocation, ...] = ()
    if MIG_ALLOCATIONS in annotations:
        try:
            mig = decode_mig_allocations(annotations[MIG_ALLOCATIONS])
        except AnnotationError as err:
            return f"the grant's MIG reservations do not decode: {err}"
    if not key.verifies(signature, uid, node, allocated, mig, family_lists(annotations)):
        return f"the {GRANT_SIGNATURE} signature does not match the pod's grant"
    try:
        signed = decode_pod_devices(allocated, DEVICES_ALLOCATED)
        left = decode_pod_devices(annotations.get(DEVICES_TO_ALLOCATE, ""), DEVICES_TO_ALLOCATE)
    except AnnotationError:
        return ""  # signed, but unreadable: the caller's decoder reports it (HAMi marks such a pod failed)
    for i, entry in enumerate(left):
        if entry and (i >= len(signed) or entry != signed[i]):
            return f"{DEVICES_TO_ALLOCATE} entry {i} is not the signed grant"
    return ""
