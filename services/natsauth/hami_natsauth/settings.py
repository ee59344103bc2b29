"""Settings of ``hami-natsauth``."""

from __future__ import annotations

from dataclasses import dataclass

from hami_common.kube import KubeSettings
from hami_common.settings import BusSettings, setting

__all__ = ["NatsAuthSettings"]


@dataclass(frozen=True)
class NatsAuthSettings(BusSettings, KubeSettings):
    """The NATS auth callout: per-node identities for the node services."""

    issuer_seed_file: str = setting(
        "/etc/hami/nats-issuer/seed", "file holding the account nkey seed that signs users (nats.conf: issuer)"
    )
    nats_account: str = setting("HAMI", "account the authorized node users are placed in")
    node_service_account: str = setting(
        "system:serviceaccount:hami-system:hami-node", "the only service account whose tokens prove a node"
    )
    token_audience: str = setting("hami-nats", "audience the node services' projected tokens are minted for")
    user_ttl: int = setting(3600, "seconds a granted identity lasts before the client must reconnect (0: ever)")
