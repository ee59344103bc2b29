"""The operator's ``hami`` command, run as a user would run it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HAMI = str(Path(sys.executable).parent / "hami")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HAMI, *args], capture_output=True, text=True, timeout=timeout, check=False)


def test_decode_shows_the_devices_of_each_container() -> None:
    done = run("decode", "hami.io/vgpu-devices-allocated", "GPU-a,NVIDIA,3000,50:;")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [[{"uuid": "GPU-a", "type": "NVIDIA", "usedmem": 3000, "usedcores": 50}], []]


def test_decode_of_a_malformed_value_names_the_annotation_and_fails() -> None:
    done = run("decode", "hami.io/node-nvidia-register", "GPU-1,10,7680,100,P4,0,true:")
    assert done.returncode == 1
    assert "hami.io/node-nvidia-register" in done.stderr


def test_unknown_command_prints_usage() -> None:
    done = run("frobnicate")
    assert done.returncode == 2
    assert "usage" in done.stderr


@pytest.mark.timeout(120)
def test_up_places_the_examples_serves_metrics_and_stops_cleanly(tmp_path: Path) -> None:
    done = run(
        "up", "--workdir", str(tmp_path), "--nodes", "2", "--gpus", "2", "--metrics-port", "0",
        "--examples", str(EXAMPLES), "--for", "1", timeout=100,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "NATS:        nats://127.0.0.1:" in out
    assert "default/memory-mib" in out
    assert "success" in out
    assert "default/cannot-fit" in out
    assert "CardInsufficientMemory" in out
    assert "hami_* series)" in out
    assert "not answering" not in out
    assert "admission" in out.split("Traces:", 1)[1]
    assert "allocate" in out.split("Traces:", 1)[1]
    assert out.rstrip().endswith("stopped.")
    kubeconfig = json.loads((tmp_path / "kubeconfig").read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"].startswith("http://127.0.0.1:")


def test_submit_without_a_running_stack_says_so(tmp_path: Path) -> None:
    done = run("submit", "-f", str(EXAMPLES / "memory-mib.yaml"), "--workdir", str(tmp_path))
    assert done.returncode == 1
    assert "no running `hami up`" in done.stderr


def test_status_without_a_running_stack_says_so(tmp_path: Path) -> None:
    done = run("status", "--workdir", str(tmp_path))
    assert done.returncode == 1
    assert "no running `hami up`" in done.stderr


@pytest.mark.timeout(150)
def test_status_from_another_terminal_shows_placements_and_why_a_pod_is_pending(tmp_path: Path) -> None:
    up = subprocess.Popen(
        [HAMI, "up", "--workdir", str(tmp_path), "--nodes", "2", "--gpus", "2", "--metrics-port", "0",
         "--examples", str(EXAMPLES), "--for", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        for line in up.stdout:
            if "`hami submit -f pod.yaml` adds pods" in line:
                break
        else:
            pytest.fail(f"hami up ended early: {up.stderr.read() if up.stderr else ''}")
        done = run("status", "--workdir", str(tmp_path))
        assert done.returncode == 0, done.stderr
        rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("default/")}
        assert "success" in rows["default/memory-mib"]
        assert "Pending" in rows["default/cannot-fit"]
        assert "CardInsufficientMemory" in rows["default/cannot-fit"]
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0
    assert out.rstrip().endswith("stopped.")
