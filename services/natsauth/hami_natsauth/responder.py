"""The auth callout's one decision: answer nats-server's authorization request for a connecting client."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from hami_common import subjects
from hami_common.errors import InvalidInput, TransientError
from hami_natsauth.claims import Signer, decode_request, encode_response, encode_user
from hami_natsauth.permissions import node_identity, node_permissions
from hami_natsauth.verifier import TokenVerifier

__all__ = ["Authorizer"]

log = logging.getLogger(__name__)


class Authorizer:
    """Grants a node's permissions to a connection whose token the verifier ties to that node; refuses
    every other connection (the static users never reach the callout: nats.conf lists them as auth_users)."""

    def __init__(
        self,
        verifier: TokenVerifier,
        signer: Signer,
        *,
        account: str,
        ttl_s: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._verifier = verifier
        self._signer = signer
        self._account = account
        self._ttl_s = ttl_s
        self._clock = clock

    async def answer(self, data: bytes) -> bytes | None:
        """The signed response to one request JWT, or None for a request that names no one to answer."""
        try:
            request = decode_request(data)
        except InvalidInput as err:
            log.warning("ignoring a malformed authorization request: %s", err)
            return None
        now = int(self._clock())
        who = request.nats.connect_opts.name or request.nats.user_nkey
        try:
            token = request.nats.connect_opts.auth_token
            if not token:
                raise InvalidInput("no token: node services connect with their service-account token")
            node = await self._verifier.node_of(token)
            subjects.subject_token(node)  # a node name that cannot be a subject token gets nothing
        except (InvalidInput, TransientError) as err:
            log.warning("refusing NATS connection %s: %s", who, err)
            return encode_response(request, signer=self._signer, now=now, error=f"not authorized: {err}").encode()
        user = encode_user(
            user_nkey=request.nats.user_nkey,
            name=node_identity(node),
            account=self._account,
            permissions=node_permissions(node),
            signer=self._signer,
            now=now,
            ttl_s=self._ttl_s,
        )
        log.info("NATS connection %s authorized as %s", who, node_identity(node))
        return encode_response(request, signer=self._signer, now=now, user_jwt=user).encode()
