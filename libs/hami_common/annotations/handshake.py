"""The scheduler's handshake ``hami.io/node-handshake`` and its health rule (hami-protocol §2.4).

Value: ``Requesting_`` + the scheduler's local time as ``YYYY-MM-DD HH:MM:SS``. Only the scheduler writes
it. ``check_handshake`` is HAMi's ``CheckHealth``: pure, the caller passes ``now`` in its local zone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

__all__ = ["HANDSHAKE_EXPIRY", "HandshakeVerdict", "check_handshake", "encode_handshake"]

REQUESTING: Final = "Requesting"
_LAYOUT: Final = "%Y-%m-%d %H:%M:%S"
HANDSHAKE_EXPIRY: Final = timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class HandshakeVerdict:
    healthy: bool
    need_update: bool  # the caller should write encode_handshake(now)


def encode_handshake(now: datetime) -> str:
    return f"{REQUESTING}_{now.strftime(_LAYOUT)}"


def check_handshake(value: str | None, now: datetime, allocatable_gpus: int) -> HandshakeVerdict:
    """HAMi's CheckHealth: an unparseable ``Requesting`` value counts as fresh, never as an error."""
    if value is None or REQUESTING not in value:
        return HandshakeVerdict(healthy=True, need_update=True)
    _, sep, stamp = value.partition("_")
    if not sep:
        return HandshakeVerdict(healthy=True, need_update=False)
    try:
        requested = datetime.strptime(stamp, _LAYOUT).replace(tzinfo=now.tzinfo)
    except ValueError:
        return HandshakeVerdict(healthy=True, need_update=False)
    if now < requested + HANDSHAKE_EXPIRY or allocatable_gpus > 0:
        return HandshakeVerdict(healthy=True, need_update=False)
    return HandshakeVerdict(healthy=False, need_update=False)
