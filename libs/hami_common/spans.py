"""Span names of a pod's scheduling trace (ARCHITECTURE §5), and the tracer's instrumentation name."""

from __future__ import annotations

from typing import Final

INSTRUMENTATION: Final = "hami"

ADMIT: Final = "admission"
FILTER: Final = "filter"
BIND: Final = "bind"
PLACE: Final = "placement publish"
STAGE: Final = "stage"
ALLOCATE: Final = "allocate"


def consume(subject: str) -> str:
    """A bus consumer handling one message, named as OpenTelemetry's messaging conventions do."""
    return f"{subject} process"
