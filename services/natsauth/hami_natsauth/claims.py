"""The JWTs of NATS auth callout (nats-io/jwt v2): the server's request, our response, the user it grants.

A NATS JWT is ``base64url(header).base64url(claims).base64url(ed25519 signature)``, signed by an nkey; the
issuer (``iss``) is the signer's public nkey. Encoding is pure: the signer and the clock come in.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Final, Protocol

import msgspec

from hami_common.errors import InvalidInput

__all__ = [
    "AuthRequest",
    "AuthRequestClaims",
    "ConnectOptions",
    "Permissions",
    "Signer",
    "SubjectRule",
    "decode_request",
    "encode_response",
    "encode_user",
]

_HEADER: Final = {"typ": "JWT", "alg": "ed25519-nkey"}
REQUEST_TYPE: Final = "authorization_request"
_RESPONSE_TYPE: Final = "authorization_response"
_USER_TYPE: Final = "user"
_VERSION: Final = 2
_NO_LIMIT: Final = -1


class Signer(Protocol):
    """An nkey that signs (``nkeys.KeyPair`` is one)."""

    @property
    def public_key(self) -> bytes: ...

    def sign(self, input: bytes) -> bytes: ...


# --- the server's request ------------------------------------------------------------------------------------


class ServerId(msgspec.Struct, kw_only=True):
    id: str  # the audience our response must name
    name: str = ""


class ConnectOptions(msgspec.Struct, kw_only=True):
    """What the client sent in CONNECT; node services send their service-account token as ``auth_token``."""

    auth_token: str = ""
    user: str = ""
    name: str = ""


class AuthRequest(msgspec.Struct, kw_only=True):
    server_id: ServerId
    user_nkey: str  # the key the server made for this connection: the subject of the user we grant
    connect_opts: ConnectOptions = msgspec.field(default_factory=ConnectOptions)
    type: str = ""


class AuthRequestClaims(msgspec.Struct, kw_only=True):
    iss: str
    nats: AuthRequest


# --- what we answer ------------------------------------------------------------------------------------------


class SubjectRule(msgspec.Struct, omit_defaults=True):
    allow: list[str] = msgspec.field(default_factory=list)
    deny: list[str] = msgspec.field(default_factory=list)


class Permissions(msgspec.Struct, frozen=True):
    """Exactly what one identity may publish and subscribe to (nothing else is allowed)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


class _UserNats(msgspec.Struct):
    pub: SubjectRule
    sub: SubjectRule
    subs: int = _NO_LIMIT
    data: int = _NO_LIMIT
    payload: int = _NO_LIMIT
    type: str = _USER_TYPE
    version: int = _VERSION


class _UserClaims(msgspec.Struct, omit_defaults=True):
    iat: int
    iss: str
    name: str
    sub: str
    aud: str  # in a non-operator server: the account the user is placed in
    nats: _UserNats
    exp: int = 0
    jti: str = ""


class _AuthResponse(msgspec.Struct, kw_only=True, omit_defaults=True):
    # no defaults: nats-io/jwt reads a claim without its version as a v1 claim, and refuses it
    type: str
    version: int
    jwt: str = ""
    error: str = ""


class _ResponseClaims(msgspec.Struct, omit_defaults=True):
    iat: int
    iss: str
    sub: str
    aud: str
    nats: _AuthResponse
    jti: str = ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(claims: _UserClaims | _ResponseClaims, signer: Signer) -> str:
    # jti: the hash of the claims without it, as nats-io/jwt computes it (an id for logs and revocation lists)
    claims.jti = ""
    digest = hashlib.new("sha512_256", msgspec.json.encode(claims)).digest()
    claims.jti = base64.b32encode(digest).decode().rstrip("=")
    head = _b64(msgspec.json.encode(_HEADER)) + "." + _b64(msgspec.json.encode(claims))
    return head + "." + _b64(signer.sign(head.encode()))


def decode_request(token: bytes) -> AuthRequestClaims:
    """The claims of the server's authorization request; raises ``InvalidInput`` on anything else.

    Its signature is not checked: the request arrives in the callout's own account, where only the server
    and this responder can publish, and the server accepts our answer only for the key it asked about.
    """
    try:
        _, body, _ = token.decode("ascii").split(".")
        claims = msgspec.json.decode(_unb64(body), type=AuthRequestClaims)
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError) as err:
        raise InvalidInput(f"not an authorization request JWT: {err}") from err
    if claims.nats.type != REQUEST_TYPE:
        raise InvalidInput(f"not an authorization request JWT: type {claims.nats.type!r}")
    return claims


def encode_user(
    *, user_nkey: str, name: str, account: str, permissions: Permissions, signer: Signer, now: int, ttl_s: int
) -> str:
    """A user JWT for ``user_nkey`` in ``account`` with exactly ``permissions``; it lapses after ``ttl_s``
    (0: never), and the server then closes the connection, which reconnects with a fresh token."""
    claims = _UserClaims(
        iat=now,
        iss=signer.public_key.decode(),
        name=name,
        sub=user_nkey,
        aud=account,
        exp=now + ttl_s if ttl_s > 0 else 0,
        nats=_UserNats(
            pub=SubjectRule(allow=list(permissions.publish)), sub=SubjectRule(allow=list(permissions.subscribe))
        ),
    )
    return _sign(claims, signer)


def encode_response(
    request: AuthRequestClaims, *, signer: Signer, now: int, user_jwt: str = "", error: str = ""
) -> str:
    """The answer to ``request``: either a user JWT (authorized) or an error (refused)."""
    claims = _ResponseClaims(
        iat=now,
        iss=signer.public_key.decode(),
        sub=request.nats.user_nkey,
        aud=request.nats.server_id.id,
        nats=_AuthResponse(type=_RESPONSE_TYPE, version=_VERSION, jwt=user_jwt, error=error),
    )
    return _sign(claims, signer)
