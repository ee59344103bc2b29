"""The bus: NATS connection, typed publish/subscribe, JetStream declarations, an embedded server."""

from hami_common.bus._client import Bus, BusStats, Delivery, Handler, Subscription
from hami_common.bus._embedded import ClusterRole, EmbeddedNats, NatsCluster, find_nats_server
from hami_common.bus._streams import ConsumerSpec, StreamSpec, placement_consumer, placement_stream

__all__ = [
    "Bus",
    "BusStats",
    "ClusterRole",
    "ConsumerSpec",
    "Delivery",
    "EmbeddedNats",
    "Handler",
    "NatsCluster",
    "StreamSpec",
    "Subscription",
    "find_nats_server",
    "placement_consumer",
    "placement_stream",
]
