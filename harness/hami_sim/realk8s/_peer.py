"""One real peer (etcd, kube-apiserver, kube-scheduler) as a child process with its own log file.

A peer can be stopped politely (SIGTERM: etcd flushes, kube-scheduler releases its Lease), killed
(SIGKILL: what a crashed node does) and started again with the same arguments. With ``restart=True`` it
is brought back whenever it exits on its own, as a kubelet restarts a container: kube-scheduler exits 1
when it loses its Lease. Every peer still running when the interpreter exits is killed.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

__all__ = ["Peer", "unshare_works"]

log = logging.getLogger(__name__)

_STOP_TIMEOUT_S: Final = 20.0
_RESTART_DELAY_S: Final = 0.5
_running: set[Peer] = set()


class Peer:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_file: Path,
        *,
        restart: bool = False,
        stop_timeout: float = _STOP_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.env = None if env is None else dict(env)  # None: this process's own
        self.stop_timeout = stop_timeout
        self.argv = list(argv)
        self.log_file = log_file
        self.restart_on_exit = restart
        self.exits: list[int] = []  # exit codes of runs that ended on their own
        self._proc: subprocess.Popen[bytes] | None = None
        self._wanted = False
        self._lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        with self._lock:
            self._wanted = True
            if self.running:
                return
            self._spawn()

    def _spawn(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as out:
            proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        self._proc = proc
        _running.add(self)
        threading.Thread(target=self._watch, args=(proc,), name=f"peer {self.name}", daemon=True).start()

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        with self._lock:
            if proc is not self._proc or not self._wanted:
                return
            self.exits.append(code)
            log.warning("%s exited with %d (%s)", self.name, code, self.tail())
            if not self.restart_on_exit:
                return
        time.sleep(_RESTART_DELAY_S)
        with self._lock:
            if self._wanted and proc is self._proc:
                self._spawn()

    def _end(self, sig: signal.Signals) -> None:
        with self._lock:
            self._wanted = False
            proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _running.discard(self)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it is not gone within ``stop_timeout``."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        self._end(signal.SIGKILL)

    def tail(self, lines: int = 5) -> str:
        with contextlib.suppress(OSError):
            return " | ".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        return ""


def unshare_works(*command: str) -> bool:
    """Whether ``unshare <command>`` succeeds here: the namespaces a peer needs may be made (root)."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", *command], capture_output=True).returncode == 0


@atexit.register
def _reap() -> None:
    for peer in list(_running):
        peer.kill()
