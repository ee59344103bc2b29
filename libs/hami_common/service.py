"""How every service process starts and stops: settings, logging, tracing, signals.

A service's ``main`` is one line::

    def main(argv: Sequence[str] | None = None) -> int:
        return service.run(ExtenderSettings, serve, argv)

``serve(settings, stop)`` is the service's async body; it returns when ``stop`` is set (SIGINT/SIGTERM)
and must close what it opened. Bad configuration exits 2 with one clear line, like a bad flag.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Final, TypeVar

from hami_common.errors import InvalidInput, TransientError
from hami_common.settings import load
from hami_common.tracing import setup_tracing

__all__ = ["EXIT_CONFIG", "EXIT_UNAVAILABLE", "configure_logging", "run", "run_loop"]

S = TypeVar("S")
T = TypeVar("T")
EXIT_CONFIG: Final = 2
EXIT_UNAVAILABLE: Final = 69  # EX_UNAVAILABLE: a peer (NATS, the apiserver) could not be reached
LOG_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on uvloop when it is installed (``uvicorn[standard]`` brings it).

    Every process of ours is an I/O multiplexer, and uvloop's sockets, TLS and scheduling cost a fraction
    of the standard loop's; where uvloop is missing the standard loop serves just the same.
    """
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr)


async def _until_signalled(body: Callable[[S, asyncio.Event], Awaitable[None]], settings: S) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await body(settings, stop)


def run(
    settings_cls: type[S],
    body: Callable[[S, asyncio.Event], Awaitable[None]],
    argv: Sequence[str] | None = None,
    *,
    name: str = "hami",
) -> int:
    """Parse settings (``--help`` exits 0), set up logging and tracing, run ``body`` until signalled."""
    configure_logging()
    try:
        settings = load(settings_cls, argv)
    except InvalidInput as err:
        logging.getLogger(name).error("bad configuration: %s", err)
        return EXIT_CONFIG
    provider = setup_tracing(name)
    try:
        run_loop(_until_signalled(body, settings))
    except TransientError as err:
        logging.getLogger(name).error("cannot start: %s", err)
        return EXIT_UNAVAILABLE
    finally:
        if provider is not None:
            provider.shutdown()
    return 0
