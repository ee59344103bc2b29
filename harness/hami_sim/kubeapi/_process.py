"""The emulator in a process of its own, as kube-apiserver is: same surface as :class:`KubeApiEmulator`.

In one process the emulator's HTTP serving and watch fan-out take the interpreter lock from the services it
serves, so the local stack measured the apiserver as much as our code; in a child process it runs on the
other core. The parent drives the child over its stdin/stdout, one JSON command and one JSON answer per
line: start (on the same port again after a stop), stop, compact, create. The child exits when its stdin
closes, so it never outlives the parent.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Literal, Self

import msgspec

from hami_sim.kubeapi._server import kubeconfig_for, write_kubeconfig

__all__ = ["Command", "KubeApiProcess", "Reply"]

_START_TIMEOUT_S: Final = 30.0
Json = dict[str, Any]


class Command(msgspec.Struct, frozen=True, kw_only=True):
    op: Literal["start", "stop", "compact", "create", "count"]
    group: str = ""
    version: str = "v1"
    plural: str = ""
    namespace: str | None = None
    body: Json | None = None
    method: str = ""
    path: str = ""


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool
    port: int = 0
    value: int = 0
    object: Json | None = None
    error: str = ""


class KubeApiProcess:
    """``start()`` spawns the child and serves; ``stop()``/``start()`` restart it on the same port, state kept."""

    def __init__(
        self, *, host: str = "127.0.0.1", port: int = 0, bookmark_interval: float = 1.0, history: int = 2000
    ) -> None:
        self.host = host
        self.port = port
        self.bookmark_interval = bookmark_interval
        self.history = history
        self._child: subprocess.Popen[bytes] | None = None
        self._serving = False
        self._lock = threading.Lock()  # one command at a time: restarts come from worker threads

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._child is None or self._child.poll() is not None else self._child.pid

    @property
    def running(self) -> bool:
        return self._serving and self._child is not None and self._child.poll() is None

    def _spawn(self) -> subprocess.Popen[bytes]:
        if self._child is not None and self._child.poll() is None:
            return self._child
        argv = [
            sys.executable, "-m", "hami_sim.kubeapi._child",
            "--host", self.host, "--port", str(self.port),
            "--bookmark-interval", str(self.bookmark_interval), "--history", str(self.history),
        ]  # fmt: skip
        # A process group of its own, so a terminal's Ctrl-C (sent to the whole foreground group) does not kill
        # it with a KeyboardInterrupt traceback under the services; it ends when its stdin closes.
        self._child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, process_group=0)
        return self._child

    def _call(self, command: Command) -> Reply:
        with self._lock:
            child = self._spawn()
            stdin, stdout = _pipes(child)
            try:
                stdin.write(msgspec.json.encode(command) + b"\n")
                stdin.flush()
                line = stdout.readline()
            except OSError as err:
                raise RuntimeError(f"the Kubernetes API emulator process is gone: {err}") from err
            if not line:
                raise RuntimeError(f"the Kubernetes API emulator process exited ({child.wait(5)})")
        reply = msgspec.json.decode(line, type=Reply)
        if not reply.ok:
            raise RuntimeError(f"the Kubernetes API emulator refused {command.op}: {reply.error}")
        return reply

    def start(self) -> Self:
        if not self.running:
            self.port = self._call(Command(op="start")).port
            self._serving = True
        return self

    def stop(self) -> None:
        if self.running:
            self._call(Command(op="stop"))
        self._serving = False

    def restart(self) -> None:
        self.stop()
        self.start()

    def compact(self) -> int:
        return self._call(Command(op="compact")).value

    def count(self, method: str, path: str) -> int:
        """How many ``method path`` requests the emulator has served, restarts included."""
        return self._call(Command(op="count", method=method, path=path)).value

    def create(self, group: str, version: str, plural: str, namespace: str | None, body: Json) -> Json:
        """Store ``body`` directly (no HTTP), as seeding a cluster does; returns the stored object."""
        reply = self._call(
            Command(op="create", group=group, version=version, plural=plural, namespace=namespace, body=body)
        )
        return reply.object or {}

    def close(self) -> None:
        """Stop serving and end the child."""
        child, self._child = self._child, None
        self._serving = False
        if child is None:
            return
        if child.stdin is not None:
            child.stdin.close()  # the child's signal to exit
        try:
            child.wait(_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()

    def kubeconfig(self, namespace: str = "default") -> Json:
        return kubeconfig_for(self.url, namespace)

    def write_kubeconfig(self, path: Path | str) -> Path:
        return write_kubeconfig(path, self.url)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _pipes(child: subprocess.Popen[bytes]) -> tuple[IO[bytes], IO[bytes]]:
    if child.stdin is None or child.stdout is None:
        raise RuntimeError("the Kubernetes API emulator process has no pipes")
    return child.stdin, child.stdout
