"""Where a running ``hami up`` is: a small JSON file in its work directory, read by ``hami submit``/``status``.

Each ``hami up`` gets a work directory of its own (``$TMPDIR/hami-up-<uid>/<pid>`` unless ``--workdir`` names
one), so two stacks never overwrite each other's kubeconfig, inventory or state. The state file records the
owner's pid and is removed when the stack stops; a state file whose pid is gone is a stack that crashed.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Final

import msgspec

from hami_common.errors import InvalidInput

__all__ = [
    "STATE_FILE",
    "NoStackError",
    "UpState",
    "add_dir_flag",
    "find_running",
    "pick_running",
    "read_state",
    "remove_state",
    "run_workdir",
    "runs_root",
    "write_state",
]

STATE_FILE: Final = "hami-up.json"


class NoStackError(InvalidInput):
    """No running ``hami up`` where one was looked for, or more than one and the caller must choose."""


class UpState(msgspec.Struct, frozen=True, kw_only=True):
    api_url: str
    kubeconfig: str
    webhook_url: str
    ca_file: str
    metrics_url: str
    nats_url: str
    kube: str = "emulated"  # or "real": kube-apiserver over TLS, which calls the webhook itself
    api_ca: str = ""  # real: the CA, certificate and key that admin requests present
    client_cert: str = ""
    client_key: str = ""
    pid: int = 0  # the `hami up` process; 0 in files written before runs had their own folder
    metrics_token_file: str = ""  # real: the bearer token deploy/'s metrics service requires on /metrics
    device_config: str = ""  # the device config every service reads ("": the defaults)


def add_dir_flag(parser: argparse.ArgumentParser) -> None:
    """``--dir``: which running ``hami up`` a client command talks to."""
    parser.add_argument(
        "--dir",
        "--workdir",
        dest="workdir",
        type=Path,
        help="the work directory of the `hami up` to use (needed only when several run)",
    )


def runs_root() -> Path:
    """One per user: every run's work directory is a folder in it, so another terminal finds them all."""
    return Path(tempfile.gettempdir()) / f"hami-up-{os.getuid()}"


def run_workdir(pid: int | None = None) -> Path:
    """The default work directory of the ``hami up`` with this pid (this process's when None)."""
    return runs_root() / str(os.getpid() if pid is None else pid)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return True  # an old state file without a pid: trust it, as before
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process reuses the pid: not our stack
        return False
    return True


def write_state(workdir: Path, state: UpState) -> Path:
    path = workdir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode(state))
    tmp.replace(path)  # a reader in another terminal never sees half a file
    return path


def remove_state(workdir: Path) -> None:
    (workdir / STATE_FILE).unlink(missing_ok=True)


def read_state(workdir: Path) -> UpState:
    """The running stack's addresses; NoStackError when none runs there (never started, stopped or crashed)."""
    try:
        state = msgspec.json.decode((workdir / STATE_FILE).read_bytes(), type=UpState)
    except FileNotFoundError:
        raise NoStackError(f"no running `hami up` in {workdir}") from None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as err:
        raise NoStackError(f"no running `hami up` in {workdir}: unreadable {STATE_FILE}: {err}") from err
    if not _alive(state.pid):
        raise NoStackError(f"no running `hami up` in {workdir}: its process {state.pid} has ended")
    return state


def find_running(root: Path | None = None) -> list[tuple[Path, UpState]]:
    """Every live ``hami up`` whose work directory is in ``root`` (or is ``root`` itself), oldest first."""
    base = runs_root() if root is None else root
    found = []
    candidates = [base, *sorted(base.iterdir(), key=lambda p: p.name)] if base.is_dir() else []
    for folder in candidates:
        if not (folder / STATE_FILE).is_file():
            continue
        try:
            state = read_state(folder)
        except NoStackError:
            continue
        if state.pid > 0:  # a pid-less file is from an older `hami up` that shared one folder: long gone
            found.append((folder, state))
    return sorted(found, key=lambda pair: (pair[0] / STATE_FILE).stat().st_mtime)


def pick_running(workdir: Path | None, root: Path | None = None) -> tuple[Path, UpState]:
    """The stack in ``workdir`` when one is named; otherwise the only one running, or a NoStackError that says
    what to do (start one, or choose with ``--dir``)."""
    if workdir is not None:
        return workdir, read_state(workdir)
    running = find_running(root)
    if not running:
        where = runs_root() if root is None else root
        raise NoStackError(
            f"no running `hami up` (looked in {where}): start one with `make run` or `./hami up`, "
            "or name its folder with --dir"
        )
    if len(running) > 1:
        listed = "; ".join(f"--dir {folder}" for folder, _ in running)
        raise NoStackError(f"{len(running)} `hami up` stacks are running; choose one: {listed}")
    return running[0]
