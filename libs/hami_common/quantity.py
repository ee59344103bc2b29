"""Kubernetes resource quantities (``500m``, ``16Gi``, ``1e3``) as exact fractions.

The grammar is Kubernetes' own: a signed decimal number and an optional binary-SI, decimal-SI or
exponent suffix. ``value`` rounds up as ``Quantity.Value()`` does; ``as_int`` is ``AsInt64()``.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction
from typing import Final

from hami_common.errors import InvalidInput

__all__ = ["as_int", "parse_quantity", "value"]

_QUANTITY: Final = re.compile(
    r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?:(?P<si>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exp>[+-]?\d+))?",
    re.ASCII,
)
_BINARY: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: Final = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_MAX_LENGTH: Final = 128  # far beyond any int64 value in any notation
_MAX_EXPONENT: Final = 64  # larger exponents overflow int64 anyway; refusing them bounds the work


@functools.lru_cache(maxsize=1024)  # a cluster's pods name few distinct quantities; Filter reads them per pod
def parse_quantity(text: str) -> Fraction:
    if len(text) > _MAX_LENGTH:  # also keeps int() below its digit limit
        raise InvalidInput(f"quantity longer than {_MAX_LENGTH} characters: {text[:20]}...")
    match = _QUANTITY.fullmatch(text.strip())
    if match is None:
        raise InvalidInput(f"quantities must match the regular expression of Kubernetes: {text!r}")
    number = Fraction(match["num"])
    if si := match["si"]:
        return number * (_BINARY[si] if si in _BINARY else _DECIMAL[si])
    if exp := match["exp"]:
        if abs(int(exp)) > _MAX_EXPONENT:
            raise InvalidInput(f"quantity exponent out of range: {text!r}")
        return number * Fraction(10) ** int(exp)
    return number


def value(text: str) -> int:
    """The quantity rounded up to an integer, like ``resource.Quantity.Value()``."""
    return math.ceil(parse_quantity(text))


def as_int(text: str) -> int | None:
    """The exact integer, or None when the quantity has a fraction (``resource.Quantity.AsInt64()``)."""
    number = parse_quantity(text)
    return number.numerator if number.denominator == 1 else None
