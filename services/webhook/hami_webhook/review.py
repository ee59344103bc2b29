"""AdmissionReview on the wire (k8s-interfaces §3.1): ``admission.k8s.io/v1`` and ``v1beta1``.

The request's ``object`` and ``oldObject`` stay raw until the rules decode them as pods, so an envelope
that is fine but carries a broken pod is answered inside a well-formed AdmissionReview (HAMi's
``Errored(400)``), while an envelope that cannot be read at all is the route's HTTP 400.
"""

from __future__ import annotations

import json
import re
from typing import Final

import msgspec

from hami_common.errors import InvalidInput

__all__ = [
    "ADMISSION_V1",
    "ADMISSION_V1BETA1",
    "API_VERSIONS",
    "JSON_PATCH",
    "REVIEW_KIND",
    "AdmissionRequest",
    "AdmissionResponse",
    "AdmissionReview",
    "NestedTooDeep",
    "ResponseReview",
    "ResultStatus",
    "UserInfo",
    "decode_review",
    "encode_review",
    "is_empty",
    "recover_uid",
]

ADMISSION_V1: Final = "admission.k8s.io/v1"
ADMISSION_V1BETA1: Final = "admission.k8s.io/v1beta1"
API_VERSIONS: Final = frozenset({ADMISSION_V1, ADMISSION_V1BETA1})
REVIEW_KIND: Final = "AdmissionReview"
JSON_PATCH: Final = "JSONPatch"


class _Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Base of the envelope: immutable, camelCase on the wire, unknown fields ignored."""


class UserInfo(_Wire, frozen=True):
    username: str = ""
    uid: str = ""
    groups: tuple[str, ...] | None = None


class AdmissionRequest(_Wire, frozen=True):
    uid: str
    namespace: str = ""
    name: str = ""
    operation: str = ""
    sub_resource: str = ""
    user_info: UserInfo = msgspec.field(default_factory=UserInfo)
    object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)  # empty when absent
    old_object: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    dry_run: bool | None = None


class AdmissionReview(_Wire, frozen=True):
    api_version: str = ""
    kind: str = ""
    request: AdmissionRequest | None = None


class ResultStatus(_Wire, frozen=True, omit_defaults=True):
    """``metav1.Status`` as controller-runtime fills it: code always, reason on a denial."""

    code: int
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    message: str = ""
    reason: str = ""


class AdmissionResponse(_Wire, frozen=True, omit_defaults=True):
    uid: str
    allowed: bool
    status: ResultStatus
    patch: bytes | None = None  # JSON encodes bytes as base64, as the apiserver expects
    patch_type: str | None = None
    warnings: tuple[str, ...] = ()  # kube-apiserver hands each to the client as a Warning header


class ResponseReview(_Wire, frozen=True):
    api_version: str
    response: AdmissionResponse
    kind: str = REVIEW_KIND


_NULL: Final = b"null"


def is_empty(raw: msgspec.Raw) -> bool:
    """True for an absent or ``null`` object (a DELETE's ``object``, a CREATE's ``oldObject``)."""
    return len(raw) == 0 or (len(raw) <= len(_NULL) + 8 and bytes(raw).strip() == _NULL)


_DECODER: Final = msgspec.json.Decoder(AdmissionReview)
_ENCODER: Final = msgspec.json.Encoder()


class NestedTooDeep(InvalidInput):
    """The JSON nests deeper than the decoder recurses (msgspec raises RecursionError, even for skipped
    values); :func:`recover_uid` may still find whom to answer."""


def decode_review(body: bytes) -> tuple[AdmissionReview, AdmissionRequest]:
    """The envelope and its request; raises InvalidInput when no answer can be addressed to it."""
    try:
        review = _DECODER.decode(body)
    except msgspec.DecodeError as err:
        raise InvalidInput(f"cannot decode the AdmissionReview: {err}") from err
    except RecursionError as err:
        raise NestedTooDeep(f"cannot decode the AdmissionReview: {err}") from err
    if review.kind != REVIEW_KIND or review.api_version not in API_VERSIONS:
        raise InvalidInput(
            f"expected an {REVIEW_KIND} of {ADMISSION_V1} or {ADMISSION_V1BETA1}, "
            f"got kind {review.kind!r} of {review.api_version!r}"
        )
    if review.request is None:
        raise InvalidInput("the AdmissionReview has no request")
    return review, review.request


def encode_review(review: ResponseReview) -> bytes:
    return _ENCODER.encode(review)


# What recover_uid reads: JSON strings (escapes included) and structural characters; numbers, literals and
# whitespace fall between matches. kube-apiserver writes request.uid near the start (kind, apiVersion, then
# request with uid first), so the scan stops at a fixed prefix and a hostile body costs little.
_TOKEN: Final = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}:,]')
_SCAN_LIMIT: Final = 64 * 1024
_REQUEST_KEY: Final = "request"


class _Frame:
    __slots__ = ("is_object", "key", "name", "want_key")

    def __init__(self, is_object: bool, name: str | None) -> None:
        self.is_object = is_object
        self.name = name  # the key this container is the value of (None in an array or at the top)
        self.key: str | None = None  # the object's current key
        self.want_key = is_object


def recover_uid(body: bytes) -> tuple[str, str] | None:
    """(apiVersion, request.uid) of an envelope too deeply nested to decode, read without recursion from its
    first 64 KiB; None when the uid is not there. The apiVersion defaults to v1 when it is not known."""
    frames: list[_Frame] = []
    api_version = ADMISSION_V1
    for match in _TOKEN.finditer(body, 0, min(len(body), _SCAN_LIMIT)):
        token = match.group()
        top = frames[-1] if frames else None
        if token in (b"{", b"["):
            name = top.key if top is not None and top.is_object else None
            frames.append(_Frame(token == b"{", name))
        elif token in (b"}", b"]"):
            if not frames:
                return None
            frames.pop()
        elif token == b":" and top is not None:
            top.want_key = False
        elif token == b"," and top is not None and top.is_object:
            top.want_key, top.key = True, None
        elif token.startswith(b'"') and top is not None:
            try:
                text = json.loads(token)
            except ValueError:
                return None
            if not isinstance(text, str):
                return None
            if top.is_object and top.want_key:
                top.key = text
            elif len(frames) == 1 and top.key == "apiVersion" and text in API_VERSIONS:
                api_version = text
            elif len(frames) == 2 and top.name == _REQUEST_KEY and top.key == "uid":
                return api_version, text
    return None
