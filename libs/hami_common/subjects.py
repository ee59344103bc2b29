"""Every NATS subject, stream and durable-consumer name (ARCHITECTURE §4); the only place they are spelt.

Variable subjects come from functions. Node names are DNS subdomains whose dots would split a NATS
subject into tokens, so a node name is mapped to one token by :func:`subject_token`.
"""

from __future__ import annotations

import re
from typing import Final

from hami_common.errors import InvalidInput

__all__ = [
    "ADMISSION",
    "ALL",
    "ALLOCATED",
    "AUTH_CALLOUT",
    "INVENTORY",
    "JS_ACK",
    "JS_API",
    "PLACEMENT",
    "PLACEMENT_STREAM",
    "SCHEDULING",
    "USAGE",
    "admission",
    "allocated",
    "inbox_prefix",
    "inventory",
    "node_from_token",
    "placement",
    "placement_consumer",
    "scheduling",
    "subject_token",
    "usage",
    "wildcard",
]

ADMISSION: Final = "hami.admission"
PLACEMENT: Final = "hami.placement"
ALLOCATED: Final = "hami.allocated"
INVENTORY: Final = "hami.inventory"
USAGE: Final = "hami.usage"
SCHEDULING: Final = "hami.scheduling"  # the extender's word on pods it could not place, per namespace
ALL: Final = "hami.>"

PLACEMENT_STREAM: Final = "HAMI_PLACEMENT"
# JetStream's own subjects: its API, and the reply subjects a consumer's acknowledgements go to.
JS_API: Final = "$JS.API"
JS_ACK: Final = "$JS.ACK"
# Where nats-server asks the auth callout to authorize a connection (nats-server's own name for it).
AUTH_CALLOUT: Final = "$SYS.REQ.USER.AUTH"
_INBOX_PREFIX: Final = "_INBOX_"  # nats-py's default is "_INBOX"; each identity gets its own below
_PLACEMENT_CONSUMER_PREFIX: Final = "nodeagent-"

# RFC 1123 subdomain: what Kubernetes allows for node names and namespaces.
_DNS_NAME: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)
_DOT_STANDIN: Final = "~"  # never in a DNS name, allowed in a NATS token: the mapping is reversible


def subject_token(name: str) -> str:
    """One NATS token for a Kubernetes object name; rejects what is not a DNS subdomain."""
    if len(name) > 253 or not _DNS_NAME.fullmatch(name):
        raise InvalidInput(f"not a Kubernetes object name, cannot be a subject token: {name!r}")
    return name.replace(".", _DOT_STANDIN)


def node_from_token(token: str) -> str:
    return token.replace(_DOT_STANDIN, ".")


def admission(namespace: str) -> str:
    return f"{ADMISSION}.{subject_token(namespace)}"


def scheduling(namespace: str) -> str:
    return f"{SCHEDULING}.{subject_token(namespace)}"


def placement(node: str) -> str:
    return f"{PLACEMENT}.{subject_token(node)}"


def allocated(node: str) -> str:
    return f"{ALLOCATED}.{subject_token(node)}"


def inventory(node: str) -> str:
    return f"{INVENTORY}.{subject_token(node)}"


def usage(node: str) -> str:
    return f"{USAGE}.{subject_token(node)}"


def wildcard(prefix: str) -> str:
    """Every subject below a prefix, e.g. ``wildcard(USAGE)`` for all nodes' usage."""
    return f"{prefix}.>"


def placement_consumer(node: str) -> str:
    """The durable consumer a node agent reads its placements through; survives agent restarts."""
    return _PLACEMENT_CONSUMER_PREFIX + subject_token(node).replace(_DOT_STANDIN, "_")


def inbox_prefix(identity: str) -> str:
    """The private reply-subject prefix of one NATS identity (a service, or ``node-<node name>``).

    NATS lets each user subscribe only below its own prefix, so no one reads another's replies; the
    identity is one token (dots mapped as in :func:`subject_token`), so ``node-a`` never prefixes
    ``node-a.b``'s inbox.
    """
    return _INBOX_PREFIX + subject_token(identity)
