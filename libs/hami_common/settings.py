"""One configuration pattern for every service: a frozen dataclass, filled from flags, then ``HAMI_*``.

A service declares its settings as a frozen dataclass whose fields all have defaults and a help text,
combining the shared bases (``BusSettings``, ``KubeSettings``) by inheritance; no class in the chain may
use ``slots=True``, since two slotted bases cannot be combined::

    @dataclass(frozen=True)
    class ExtenderSettings(BusSettings, KubeSettings):
        http_port: int = setting(8443, "port of the extender's HTTP API")

``load(ExtenderSettings, argv)`` builds an ``argparse`` parser with one ``--http-port`` flag per field.
The value of a field is, in order of precedence: the flag, the environment variable ``HAMI_HTTP_PORT``,
the default. ``--help`` lists every flag with its variable and default. Settings are read once, at
start-up, by the edge (``main`` or a lifespan); nothing below the edge reads the environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from hami_common.errors import InvalidInput

__all__ = ["ENV_PREFIX", "BusSettings", "env_name", "flag_name", "load", "setting", "to_argv"]

ENV_PREFIX: Final = "HAMI_"
_HELP: Final = "help"

T = TypeVar("T")
S = TypeVar("S")


def setting(default: T, help: str) -> T:
    """Declare one setting: its default and the sentence ``--help`` shows for it."""
    if isinstance(default, list | dict | set):
        raise TypeError("settings defaults must be immutable; use a tuple")
    return dataclasses.field(default=default, metadata={_HELP: help})


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _parse_tuple(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _converter(tp: object) -> Callable[[str], Any]:
    """The string-to-value function for one field type (the only types settings may have)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            inner = _converter(args[0])
            return lambda s: None if s == "" else inner(s)
    if tp is bool:
        return _parse_bool
    if tp in (int, float, str, Path):
        return typing.cast(Callable[[str], Any], tp)
    if typing.get_origin(tp) is tuple:
        return _parse_tuple
    raise TypeError(f"unsupported settings type {tp!r}")


def load(
    cls: type[S],
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    given: Mapping[str, Any] | None = None,
) -> S:
    """Parse ``argv`` and ``env`` (default: the process's own) into ``cls``; ``given`` (typed field values)
    replaces what they say, before the settings check themselves.

    A malformed environment value raises ``InvalidInput`` naming the variable; a malformed flag exits 2
    with argparse's message, and ``--help`` exits 0.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a settings dataclass")
    environ = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    parser = argparse.ArgumentParser(
        description=(cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        convert = _converter(tp)
        var = env_name(field.name)
        help_text = f"{field.metadata.get(_HELP, '')} [env {var}]"
        if var in environ:
            try:
                values[field.name] = convert(environ[var])
            except ValueError as err:
                raise InvalidInput(f"environment {var}: {err}") from err
        if tp is bool or tp == (bool | None):  # None: not given, a file (e.g. the device config) decides
            parser.add_argument(
                flag_name(field.name),
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=f"{help_text} (default: {field.default})",
            )
        else:
            parser.add_argument(
                flag_name(field.name),
                dest=field.name,
                type=convert,
                default=argparse.SUPPRESS,
                metavar=var.removeprefix(ENV_PREFIX),
                help=f"{help_text} (default: {field.default!r})",
            )
    values.update(vars(parser.parse_args(argv)))  # a bad flag exits 2 with argparse's own message
    return cls(**(values | dict(given or {})))


def to_argv(settings: object) -> list[str]:
    """The flags that ``load`` turns back into ``settings`` (defaults left out): how a parent hands a
    service its settings when it runs it as a process of its own."""
    if not dataclasses.is_dataclass(settings) or isinstance(settings, type):
        raise TypeError(f"{settings!r} is not a settings instance")
    argv: list[str] = []
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if value == field.default:
            continue
        flag = flag_name(field.name)
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag.removeprefix("--"))
        elif isinstance(value, tuple):
            argv.append(f"{flag}={','.join(str(v) for v in value)}")
        else:
            argv.append(f"{flag}={'' if value is None else value}")
    return argv


@dataclasses.dataclass(frozen=True)  # no slots: service settings combine bases by multiple inheritance
class BusSettings:
    """How a service reaches NATS."""

    nats_url: str = setting("nats://127.0.0.1:4222", "NATS server URL(s), comma separated")
    nats_user: str = setting("", "NATS user name (empty: no authentication, local development only)")
    nats_password: str = setting("", "NATS password")
    nats_creds: str = setting("", "path of a NATS credentials file (takes precedence over user/password)")
    nats_token_file: str = setting(
        "", "path of a token sent to NATS on every (re)connect, re-read each time (a rotating service-account token)"
    )
    nats_ca_file: str = setting("", "CA bundle that verifies the NATS server's certificate (set: TLS is required)")
    nats_identity: str = setting("", "who this connection is to NATS; its replies come on that identity's inbox")
    nats_connect_timeout: float = setting(2.0, "seconds to wait for each connection attempt")
    service_name: str = setting("hami", "name this process reports to NATS and tracing")
