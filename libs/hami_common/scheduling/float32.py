"""IEEE single precision, as Go's ``float32`` arithmetic rounds it (numpy is not a dependency)."""

from __future__ import annotations

import struct
from typing import Final

__all__ = ["f32", "f32_div"]

_PACK: Final = struct.Struct("<f")


def f32(x: float) -> float:
    """Round a double to the nearest float32, returned as a Python float."""
    result: float = _PACK.unpack(_PACK.pack(x))[0]
    return result


def f32_div(numerator: float, denominator: float) -> float:
    """``float32(a) / float32(b)`` rounded to float32."""
    return f32(f32(numerator) / f32(denominator))
