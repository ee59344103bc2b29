"""Declarations of JetStream streams and durable consumers, and the ones the system uses."""

from __future__ import annotations

from dataclasses import dataclass

from hami_common import subjects

__all__ = ["ConsumerSpec", "StreamSpec", "placement_consumer", "placement_stream"]


@dataclass(frozen=True, slots=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    max_age_s: float = 24 * 3600.0
    duplicate_window_s: float = 120.0  # publishes with the same Nats-Msg-Id inside it are stored once
    replicas: int = 1  # copies kept by a NATS cluster (its consumers get as many); 3 survives losing a server


@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    durable: str
    filter_subject: str
    ack_wait_s: float = 30.0  # an un-acknowledged message is delivered again after this long
    max_deliver: int = -1
    max_ack_pending: int = 1000


def placement_stream(replicas: int = 1) -> StreamSpec:
    """Placement decisions, kept a day so a node agent that was down gets every decision it missed."""
    return StreamSpec(
        name=subjects.PLACEMENT_STREAM, subjects=(subjects.wildcard(subjects.PLACEMENT),), replicas=replicas
    )


def placement_consumer(node: str, ack_wait_s: float = 30.0) -> ConsumerSpec:
    return ConsumerSpec(
        durable=subjects.placement_consumer(node),
        filter_subject=subjects.placement(node),
        ack_wait_s=ack_wait_s,
    )
