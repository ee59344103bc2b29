"""Runs the compiled C test programs of native/vgpu under the interposer, plain or sanitized."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
VGPU_DIR: Final = REPO_ROOT / "native" / "vgpu"
BUILD: Final = VGPU_DIR / "build"
STUB_DIR: Final = BUILD / "stub"
GiB: Final = 1 << 30
MiB: Final = 1 << 20
OOM: Final = 2  # CUDA_ERROR_OUT_OF_MEMORY

Variant = Literal["plain", "asan"]
Via = Literal["direct", "dlsym", "procaddr"]

# Any sanitizer report ends the process with these codes, so a clean exit means a clean run.
ASAN_OPTIONS: Final = "halt_on_error=1:exitcode=66:detect_leaks=1:abort_on_error=0"
UBSAN_OPTIONS: Final = "halt_on_error=1:print_stacktrace=1:exitcode=67"
_INHERITED_PREFIXES: Final = ("CUDA_", "GPU_CORE", "VGPU_", "LIBCUDA_", "LD_PRELOAD", "ASAN_", "UBSAN_")


def _runtime(name: str) -> str:
    out = subprocess.run(["cc", f"-print-file-name={name}"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def program(name: str, variant: Variant = "plain") -> Path:
    return BUILD / ("asan" if variant == "asan" else "") / name


def environment(variant: Variant, cache: Path, extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_PREFIXES)}
    env["LD_LIBRARY_PATH"] = str(STUB_DIR)
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(cache)
    env["VGPU_LIMITS_FILE"] = str(cache.with_suffix(".no-limits-file"))
    if variant == "asan":
        libs = [_runtime("libasan.so"), _runtime("libubsan.so"), str(BUILD / "asan" / "libvgpu.so")]
        env["LD_PRELOAD"] = " ".join(libs)
        env["ASAN_OPTIONS"] = ASAN_OPTIONS
        env["UBSAN_OPTIONS"] = UBSAN_OPTIONS
    else:
        env["LD_PRELOAD"] = str(BUILD / "libvgpu.so")
    env.update(extra)
    return env


@dataclass(frozen=True, slots=True)
class Record:
    """One output line of vgpu_probe: `command key=value ...`."""

    command: str
    fields: Mapping[str, str]

    def num(self, key: str) -> int:
        return int(self.fields[key])

    @property
    def rc(self) -> int:
        return int(self.fields["rc"])


def parse(line: str) -> Record:
    head, *pairs = line.split()
    return Record(head, dict(p.split("=", 1) for p in pairs if "=" in p))


@dataclass(frozen=True, slots=True)
class Run:
    records: tuple[Record, ...]
    stderr: str
    returncode: int

    def of(self, command: str) -> list[Record]:
        return [r for r in self.records if r.command == command]

    def one(self, command: str) -> Record:
        found = self.of(command)
        assert len(found) == 1, f"expected one {command!r} line, got {found}"
        return found[0]

    def log_lines(self, needle: str) -> list[str]:
        return [line for line in self.stderr.splitlines() if needle in line]


def assert_clean_exit(returncode: int, stderr: str) -> None:
    assert "AddressSanitizer" not in stderr, stderr
    assert "LeakSanitizer" not in stderr, stderr
    assert "runtime error" not in stderr, stderr
    assert returncode == 0, f"exit {returncode}: {stderr}"


@dataclass(frozen=True, slots=True)
class Probe:
    """vgpu_probe with one shared-cache file and one sanitizer variant."""

    variant: Variant
    cache: Path

    def argv(self, commands: Sequence[str], via: Via, options: Sequence[str]) -> list[str]:
        return [str(program("vgpu_probe", self.variant)), f"--via={via}", *options, *commands]

    def run(
        self,
        *commands: str,
        env: Mapping[str, str] | None = None,
        via: Via = "direct",
        options: Sequence[str] = (),
        timeout: float = 60,
    ) -> Run:
        proc = subprocess.run(
            self.argv(commands, via, options),
            env=environment(self.variant, self.cache, env or {}),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert_clean_exit(proc.returncode, proc.stderr)
        return Run(tuple(parse(x) for x in proc.stdout.splitlines() if x.strip()), proc.stderr, proc.returncode)

    @contextmanager
    def start(self, *commands: str, env: Mapping[str, str] | None = None) -> Iterator[Session]:
        """A probe running in the background; its `wait` commands block until `Session.proceed()`."""
        proc = subprocess.Popen(
            self.argv(commands, "direct", ()),
            env=environment(self.variant, self.cache, env or {}),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        session = Session(proc)
        try:
            yield session
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            session.join_reader()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                assert stream is not None
                stream.close()


class Session:
    """A running probe. A reader thread queues its stdout lines, so waiting for one has a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.records: list[Record] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # stderr is drained as it comes: a probe logging one line per refused allocation would otherwise
        # fill the pipe and block in write(2) long before finish() reads it.
        self._stderr: list[str] = []
        self._err_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._err_reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def join_reader(self) -> None:
        self._reader.join(timeout=10)
        self._err_reader.join(timeout=10)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def next_line(self, timeout: float = 30) -> str | None:
        """The next stdout line, or None if none arrives within `timeout` seconds (or at EOF)."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line and line != "ready":
            self.records.append(parse(line))
        return line

    def until(self, command: str, timeout: float = 30) -> Record | str:
        """Read lines until one starting with `command` (or the `ready` marker) arrives."""
        while True:
            line = self.next_line(timeout)
            assert line, f"{command!r} did not arrive in {timeout}s"
            if line == command:
                return line
            if line.split()[0] == command:
                return parse(line)

    def wait_ready(self) -> None:
        self.until("ready")

    def proceed(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60) -> tuple[list[Record], str]:
        self.proc.wait(timeout=timeout)
        self._err_reader.join(timeout)
        err = "".join(self._stderr)
        self._reader.join(timeout)
        while self.next_line(timeout=0.01) is not None:
            pass
        assert_clean_exit(self.proc.returncode, err)
        return self.records, err
