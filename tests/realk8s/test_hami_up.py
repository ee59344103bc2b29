"""``hami up`` on the real control plane, run as a user runs it: the installed console script in a terminal of
its own, ``hami status`` from a second one, then Ctrl-C.

With the binaries built, ``hami up`` with no ``--kube`` runs etcd, kube-apiserver and kube-scheduler; the first
test relies on exactly that default, so a change of default or a readiness check that forgets a kind of node
(the MIG node is on by default) fails here as it would for the user.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_sim.realk8s import K8sBinaries, uts_namespaces_work

ROOT = Path(__file__).resolve().parents[2]
HAMI = str(Path(sys.executable).parent / "hami")
READY = "adds pods"  # the last line `hami up` prints once the examples are placed
STOP_S = 120.0  # the stop of a real stack on a loaded 2-core machine: etcd, kube-apiserver, every service


def _start(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    # TMPDIR: the run's default work directory, where `hami status` looks, is under this test's folder
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    up = subprocess.Popen(
        [HAMI, "up", *flags, "--metrics-port", "0"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env,
    )  # fmt: skip
    return up, env


def _until_ready(up: subprocess.Popen[str]) -> str:
    assert up.stdout is not None
    seen = []
    for line in up.stdout:
        seen.append(line)
        if READY in line:
            return "".join(seen)
    up.wait()
    pytest.fail(f"hami up ended (rc {up.returncode}) before it was ready:\n{''.join(seen)}")


def _ctrl_c(up: subprocess.Popen[str]) -> str:
    """Ctrl-C as a terminal sends it (to the whole process group); what was printed after the ready line."""
    os.killpg(up.pid, signal.SIGINT)
    try:
        rest, _ = up.communicate(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        os.killpg(up.pid, signal.SIGKILL)
        rest, _ = up.communicate()
        pytest.fail(f"hami up did not stop within {STOP_S:.0f} s after Ctrl-C:\n{rest}")
    return rest


@pytest.fixture
def stopped() -> Iterator[list[subprocess.Popen[str]]]:
    """Stacks a failed assertion left running are killed, never leaked into the next test."""
    ups: list[subprocess.Popen[str]] = []
    yield ups
    for up in ups:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.communicate()


def _status(env: dict[str, str]) -> dict[str, str]:
    """`hami status` from another terminal, which finds the running stack by itself: pod -> its row."""
    done = subprocess.run([HAMI, "status"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cluster: https://127.0.0.1:")  # kube-apiserver over TLS, not the emulator
    return {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("default/")}


def _status_json(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [HAMI, "status", "-o", "json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    view: dict[str, object] = json.loads(done.stdout)
    return view


@pytest.mark.timeout(420)
def test_hami_up_with_every_default_runs_on_the_real_control_plane(
    k8s: K8sBinaries, tmp_path: Path, stopped: list[subprocess.Popen[str]]
) -> None:
    up, env = _start(tmp_path)  # no --kube: the binaries are built, so the real one
    stopped.append(up)
    out = _until_ready(up)
    assert "real Kubernetes" in out.splitlines()[0]
    assert "1 MIG node" in out  # the default MIG node is started and waited for
    assert "Kubernetes:  https://127.0.0.1:" in out
    placed = {line.split()[0]: line for line in out.splitlines() if line.startswith("default/")}
    assert "success" in placed["default/memory-mib"]
    assert "mig-node-0" in placed["default/mig-small"]  # only the MIG node has MIG instances
    assert "Pending" in placed["default/cannot-fit"]
    assert "CardInsufficientMemory" in placed["default/cannot-fit"]  # kube-scheduler's event, the extender's words
    rows = _status(env)
    for pod in ("default/memory-mib", "default/several-gpus", "default/mig-small"):
        assert "success" in rows[pod], rows[pod]
    assert "Pending" in rows["default/cannot-fit"]
    nodes = {gpu["node"] for gpu in _status_json(env)["gpus"]}  # type: ignore[attr-defined]
    assert nodes == {"gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3", "mig-node-0"}
    rest = _ctrl_c(up)
    assert up.returncode == 0, rest
    assert "Traceback" not in out + rest
    assert rest.rstrip().endswith("stopped.")
    done = subprocess.run([HAMI, "status"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert "no running `hami up`" in done.stderr  # the stop removed what `hami status` finds


@pytest.mark.timeout(480)
@pytest.mark.skipif(
    not uts_namespaces_work(), reason="two scheduler replicas need a UTS namespace each (unshare --uts)"
)
def test_hami_up_real_with_every_option_combined(
    k8s: K8sBinaries, tmp_path: Path, stopped: list[subprocess.Popen[str]]
) -> None:
    vendors = ("ascend", "cambricon", "hygon")
    up, env = _start(
        tmp_path,
        "--kube", "real", "--nodes", "2", "--gpus", "4", "--mig-nodes", "2",
        "--vendors", ",".join(("nvidia", *vendors)), "--scheduler-replicas", "2", "--nats-servers", "3",
    )  # fmt: skip
    stopped.append(up)
    out = _until_ready(up)
    nats = next(line for line in out.splitlines() if line.startswith("NATS:"))
    assert len(nats.split(",")) == 3  # three servers, each a URL the clients may use
    placed = {line.split()[0]: line for line in out.splitlines() if line.startswith("default/")}
    assert "success" in placed["default/memory-mib"]
    assert placed["default/mig-small"].split()[1] in {"mig-node-0", "mig-node-1"}, out
    for vendor in vendors:
        assert f"pod/{vendor}-" in out  # each vendor's example pod was submitted beside its node
    devices = {(gpu["node"], gpu["vendor"]) for gpu in _status_json(env)["gpus"]}  # type: ignore[attr-defined]
    # every NVIDIA node registered, and each vendor's node with its own family's devices
    assert {node for node, vendor in devices if vendor == "NVIDIA"} == {
        "gpu-node-0", "gpu-node-1", "mig-node-0", "mig-node-1"
    }  # fmt: skip
    assert {node for node, vendor in devices if vendor != "NVIDIA"} == {f"{v}-node-0" for v in vendors}
    kubeconfig = next(line.split()[1] for line in out.splitlines() if line.startswith("kubeconfig:"))
    listed = subprocess.run(
        [k8s["kubectl"], "--kubeconfig", kubeconfig, "get", "nodes", "-o", "name"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    for vendor in vendors:  # each vendor's node joined the real cluster
        assert f"node/{vendor}-node-0" in listed.stdout.split()
    rest = _ctrl_c(up)
    assert up.returncode == 0, rest
    assert "Traceback" not in out + rest
    assert rest.rstrip().endswith("stopped.")
