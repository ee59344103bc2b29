"""Serving a service's FastAPI app in this process, on a socket the caller bound (so a restart keeps its port)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import uvicorn

from hami_sim.net import listening_socket

__all__ = ["QuietServer", "bind_loopback", "serve_app"]

StartedCallback = Callable[[Mapping[str, Any]], None]


class QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers (the stack owns Ctrl-C), telling ``on_started`` the lifespan state."""

    def __init__(self, config: uvicorn.Config, on_started: StartedCallback | None = None) -> None:
        super().__init__(config)
        self._on_started = on_started

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self._on_started is not None and not self.should_exit:
            self._on_started(self.lifespan.state)


def bind_loopback(port: int = 0) -> socket.socket:
    return listening_socket("127.0.0.1", port)


async def serve_app(
    app: Any, sock: socket.socket, stop: asyncio.Event, on_started: StartedCallback | None = None
) -> None:
    """Serve ``app`` (lifespan on) on ``sock`` until ``stop`` is set; uvicorn closes the socket when done."""
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_keep_alive=30)
    server = QuietServer(config, on_started)
    async with asyncio.TaskGroup() as tg:
        serving = tg.create_task(server.serve(sockets=[sock]), name="uvicorn")
        stopping = tg.create_task(stop.wait(), name="stop")
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        stopping.cancel()
