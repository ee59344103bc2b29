"""``hami`` as the image installs it: the project's wheel alone, in a clean virtual environment (no dev extras,
no checkout on its path). Every command runs there, as a subprocess: the operator's commands work, and
``hami up`` says in one line that it needs a checkout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from hami_cli.status import Overview

ROOT = Path(__file__).resolve().parent.parent
DEV_HAMI = str(Path(sys.executable).parent / "hami")
READY = "adds pods"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``hami`` of a fresh venv holding the wheel built from this checkout and its runtime dependencies."""
    where = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(where / "dist"),
         str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (where / "dist").glob("hami_py-*.whl")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return venv / "bin" / "hami"


def run(hami: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # a clean environment: nothing of the dev venv or the checkout reaches the installed command
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "TMPDIR": os.environ.get("TMPDIR", "/tmp")}
    return subprocess.run(
        [str(hami), *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env, check=False
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A local stack run from the checkout (the only place `hami up` runs), for the installed commands to use."""
    workdir = tmp_path_factory.mktemp("stack")
    up = subprocess.Popen(
        [DEV_HAMI, "up", "--kube", "emulated", "--workdir", str(workdir), "--nodes", "1", "--gpus", "2",
         "--mig-nodes", "0", "--metrics-port", "0", "--no-examples", "--for", "400"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=ROOT,
    )  # fmt: skip
    assert up.stdout is not None
    for line in up.stdout:
        if READY in line:
            break
    else:
        pytest.fail(f"hami up ended early: {up.stderr.read() if up.stderr else ''}")
    yield workdir
    up.send_signal(signal.SIGINT)
    up.communicate(timeout=120)


@pytest.mark.timeout(900)
def test_every_command_runs_from_the_runtime_install(installed: Path, stack: Path, tmp_path: Path) -> None:
    assert run(installed, "--version", cwd=tmp_path).stdout.startswith("hami ")
    for command in ("submit", "status", "decode"):
        shown = run(installed, command, "--help", cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith(f"usage: hami {command}")
    assert run(installed, "decode", "hami.io/bind-phase", "success", cwd=tmp_path).stdout.strip() == '"success"'
    # hami up needs the checkout's deploy/, examples/ and native/: one line saying so, not a traceback
    for args in (["--for", "1"], ["--help"]):
        refused = run(installed, "up", *args, cwd=tmp_path)
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1
        assert "checkout" in refused.stderr
    # the operator's commands against the running stack
    pod = ROOT / "examples" / "memory-mib.yaml"
    created = run(installed, "submit", "-f", str(pod), "--dir", str(stack), cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "pod/memory-mib created"
    shown = run(installed, "status", "--dir", str(stack), "-o", "json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    view = msgspec.json.decode(shown.stdout, type=Overview)
    assert [row.pod for row in view.pods] == ["default/memory-mib"]
    assert "Traceback" not in created.stderr + shown.stderr + refused.stderr
