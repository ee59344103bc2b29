"""The emulator as a context manager: a uvicorn server on a loopback port, in a thread of its own."""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import uvicorn

from hami_common.service import run_loop
from hami_sim.kubeapi._app import create_app
from hami_sim.kubeapi._store import Store
from hami_sim.net import listening_socket

__all__ = ["KubeApiEmulator", "kubeconfig_for", "write_kubeconfig"]

CONTEXT: Final = "hami-sim"
_START_TIMEOUT: Final = 10.0


def kubeconfig_for(url: str, namespace: str = "default") -> dict[str, Any]:
    """A kubeconfig that lets the official client and kubectl reach the emulator at ``url`` unchanged."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT, "cluster": {"server": url}}],
        "users": [{"name": CONTEXT, "user": {"token": CONTEXT}}],
        "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": namespace}}],
        "current-context": CONTEXT,
    }


def write_kubeconfig(path: Path | str, url: str) -> Path:
    """Write the kubeconfig for ``url`` (JSON, which is YAML too) and return its path."""
    target = Path(path)
    target.write_text(json.dumps(kubeconfig_for(url), indent=2) + "\n")
    return target


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, started: threading.Event) -> None:
        super().__init__(config)
        self._started_event = started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self._started_event.set()


class KubeApiEmulator:
    """An emulated kube-apiserver over real HTTP.

    ``with KubeApiEmulator() as api:`` serves on a free loopback port; ``api.write_kubeconfig(path)`` lets the
    official client and kubectl connect unchanged. ``stop()`` then ``start()`` serve the same state on the
    same port again, as an apiserver restart would; ``compact()`` forgets the watch history (410 Gone).
    """

    def __init__(
        self, *, host: str = "127.0.0.1", port: int = 0, bookmark_interval: float = 1.0, history: int = 2000
    ) -> None:
        self.host = host
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.store = Store(history=history)
        self.requests: deque[tuple[str, str]] = deque(maxlen=10_000)  # (method, path), across restarts
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Self:
        if self.running:
            return self
        self.store.serve_watches()
        sock = listening_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        app = create_app(self.store, f"{self.host}:{self.port}", self.bookmark_interval, self.requests)
        config = uvicorn.Config(
            app,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            timeout_keep_alive=30,
        )
        started = threading.Event()
        server = _Server(config, started)
        thread = threading.Thread(
            target=lambda: run_loop(server.serve(sockets=[sock])), name=f"kubeapi-{self.port}", daemon=True
        )
        thread.start()
        if not started.wait(_START_TIMEOUT):
            server.should_exit = True
            raise RuntimeError("the Kubernetes API emulator did not start")
        self._server, self._thread = server, thread
        return self

    def stop(self) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self.store.close_watchers()
        server.should_exit = True
        thread.join(_START_TIMEOUT)
        self._server = self._thread = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def count(self, method: str, path: str) -> int:
        """How many ``method path`` requests this emulator has served, restarts included."""
        return sum(1 for entry in list(self.requests) if entry == (method, path))

    def compact(self) -> int:
        return self.store.compact()

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        return kubeconfig_for(self.url, namespace)

    def write_kubeconfig(self, path: Path | str) -> Path:
        """Write a kubeconfig for this emulator (JSON, which is YAML too) and return its path."""
        return write_kubeconfig(path, self.url)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
