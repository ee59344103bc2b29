"""Who may do what on the bus: the permissions the callout grants a node (pure, ARCHITECTURE §4)."""

from __future__ import annotations

from typing import Final

from hami_common import subjects
from hami_natsauth.claims import Permissions

__all__ = ["NODE_IDENTITY_PREFIX", "node_identity", "node_permissions"]

NODE_IDENTITY_PREFIX: Final = "node-"  # no static user's name starts with it, so no inbox is shared


def node_identity(node: str) -> str:
    """The NATS identity of a node's services (the allocator and the node agent of one DaemonSet pod)."""
    return NODE_IDENTITY_PREFIX + node


def node_permissions(node: str) -> Permissions:
    """Publish only this node's usage, inventory and allocation results; of JetStream, read the placement
    stream's info and use only this node's durable consumer (never create or change the stream: the
    extender alone declares it); receive replies only on this node's own inbox."""
    stream = subjects.PLACEMENT_STREAM
    consumer = subjects.placement_consumer(node)
    api = subjects.JS_API
    return Permissions(
        publish=(
            subjects.usage(node),
            subjects.inventory(node),
            subjects.allocated(node),
            f"{api}.INFO",
            f"{api}.STREAM.INFO.{stream}",
            f"{api}.CONSUMER.INFO.{stream}.{consumer}",
            # the filter is part of the subject, and the server holds the request's config to it
            f"{api}.CONSUMER.CREATE.{stream}.{consumer}.{subjects.placement(node)}",
            f"{api}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
            f"{subjects.JS_ACK}.{stream}.{consumer}.>",
        ),
        subscribe=(subjects.wildcard(subjects.inbox_prefix(node_identity(node))),),
    )
