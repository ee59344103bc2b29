"""``hami-natsauth``: nats-server's auth callout, answering until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import nkeys

from hami_common import service, subjects
from hami_common.bus import Bus
from hami_common.errors import InvalidInput
from hami_common.kube import KubeClient
from hami_natsauth.claims import Signer
from hami_natsauth.responder import Authorizer
from hami_natsauth.settings import NatsAuthSettings
from hami_natsauth.verifier import TokenReviewVerifier

__all__ = ["load_signer", "main", "serve"]


def load_signer(seed_file: str) -> Signer:
    """The account key that signs users; its public key is nats.conf's ``auth_callout.issuer``."""
    try:
        seed = Path(seed_file).read_bytes().strip()
        signer: Signer = nkeys.from_seed(bytearray(seed))
    except (OSError, nkeys.NkeysError, ValueError) as err:
        raise InvalidInput(f"issuer seed {seed_file}: {err!r}") from err
    if not signer.public_key.startswith(b"A"):
        raise InvalidInput(f"issuer seed {seed_file}: not an account key")
    return signer


async def serve(settings: NatsAuthSettings, stop: asyncio.Event) -> None:
    signer = load_signer(settings.issuer_seed_file)
    async with KubeClient.from_settings(settings) as kube, await Bus.connect(settings) as bus:
        verifier = TokenReviewVerifier(kube, username=settings.node_service_account, audience=settings.token_audience)
        authorizer = Authorizer(verifier, signer, account=settings.nats_account, ttl_s=settings.user_ttl)
        await bus.reply(subjects.AUTH_CALLOUT, authorizer.answer)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(NatsAuthSettings, serve, argv, name="hami-natsauth")
