"""Span names of a pod's scheduling trace (ARCHITECTURE §5), and the tracer's instrumentation name.

A span name is one per step, never per node or per pod: a collector groups spans by name, so a name with a
node in it would make one operation of every node (and every namespace). The node is a span attribute
(``logkeys.NODE``), as the bind span carries it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from hami_common import logkeys, subjects

INSTRUMENTATION: Final = "hami"

ADMIT: Final = "admission"
FILTER: Final = "filter"
BIND: Final = "bind"
PLACE: Final = "placement publish"
STAGE: Final = "stage"
ALLOCATE: Final = "allocate"

# The subjects whose last token names an object (the node, or the admitted pod's namespace), and the span
# attribute that object goes to.
_PER_OBJECT: Final = (
    (subjects.PLACEMENT, logkeys.NODE),
    (subjects.ALLOCATED, logkeys.NODE),
    (subjects.INVENTORY, logkeys.NODE),
    (subjects.USAGE, logkeys.NODE),
    (subjects.ADMISSION, logkeys.NAMESPACE),
    (subjects.SCHEDULING, logkeys.NAMESPACE),
)
# OpenTelemetry's messaging conventions: the concrete subject is an attribute, never the name.
DESTINATION: Final = "messaging.destination.name"


def _split(subject: str) -> tuple[str, Mapping[str, str]]:
    for prefix, key in _PER_OBJECT:
        head, dot, token = subject.rpartition(".")
        if dot and head == prefix and token:
            return prefix, {key: subjects.node_from_token(token)}
    return subject, {}


def consume(subject: str) -> str:
    """A bus consumer handling one message, named as OpenTelemetry's messaging conventions do, after the
    subject's family (``hami.placement process``): the node or namespace token is left out of the name."""
    family, _ = _split(subject)
    return f"{family} process"


def consume_attributes(subject: str) -> dict[str, str]:
    """What :func:`consume` leaves out of the name: the whole subject, and the node (or namespace) it names."""
    _, named = _split(subject)
    return {DESTINATION: subject, **named}
