"""Time values in annotations (hami-protocol §2.8): Unix seconds, RFC 3339, and the handshake layout."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Final

from hami_common.errors import AnnotationError

__all__ = [
    "decode_rfc3339",
    "decode_unix_seconds",
    "encode_rfc3339",
    "encode_unix_seconds",
]

# Go's time.RFC3339 accepts an optional fraction; Python's fromisoformat accepts far more, so gate it.
_RFC3339: Final = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})", re.ASCII)
_MAX_UNIX: Final = 253402300799  # 9999-12-31T23:59:59Z, the last second datetime can hold


def encode_unix_seconds(moment: datetime) -> str:
    """``hami.io/vgpu-time`` / ``hami.io/bind-time``: whole seconds since the epoch, as decimal text."""
    return str(int(moment.timestamp()))


def decode_unix_seconds(value: str, key: str) -> datetime:
    text = value.strip()
    if not text.isascii() or not text.isdigit() or int(text) > _MAX_UNIX:
        raise AnnotationError(key, f"not a Unix time in seconds: {value!r}")
    return datetime.fromtimestamp(int(text), tz=UTC)


def encode_rfc3339(moment: datetime) -> str:
    """Go's ``time.RFC3339`` layout: whole seconds, ``Z`` for UTC, else ``±hh:mm``."""
    if moment.tzinfo is None:
        raise ValueError("RFC 3339 needs an aware datetime")
    moment = moment.replace(microsecond=0)
    offset = moment.utcoffset()
    if offset == timedelta(0):
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    return moment.isoformat()


def decode_rfc3339(value: str, key: str) -> datetime:
    text = value.strip()
    if not _RFC3339.fullmatch(text):
        raise AnnotationError(key, f"not an RFC 3339 time: {value!r}")
    # Python < 3.12 takes at most 6 fractional digits; Go writes up to 9.
    text = re.sub(r"\.(\d{6})\d+", r".\1", text)
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as err:  # e.g. month 13
        raise AnnotationError(key, f"not an RFC 3339 time: {value!r}") from err
