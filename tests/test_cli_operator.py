"""What an operator meets in ``hami``: every vendor in ``hami status``, failed and unreadable pods listed, one
line (never a traceback) for a mistake or an unreachable cluster, defaults in every ``--help``, a fast
``hami status`` and a ``hami up`` that leaves nothing behind."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from hami_cli import decode, status, submit, up
from hami_cli.decode import family_decoders
from hami_cli.helpfmt import DefaultsHelp
from hami_cli.report import NVIDIA, Fleet, short_uuid
from hami_cli.state import read_state
from hami_cli.status import FAILED, UNREADABLE, build_overview, default_fleet
from hami_common.annotations import (
    BIND_PHASE,
    DEVICES_ALLOCATED,
    NODE_REGISTER,
    ContainerDevice,
    DeviceInfo,
    encode_node_devices,
    encode_pod_devices,
)
from hami_common.kube import Container, Node, ObjectMeta, Pod, PodSpec, PodStatus, ResourceRequirements
from hami_common.scheduling.policy import DEFAULT_SCHEDULER_NAME
from hami_sim.realk8s import BIN_ENV, PEERS

ROOT = Path(__file__).resolve().parent.parent
HAMI = str(Path(sys.executable).parent / "hami")
READY = "adds pods"
UUID = "GPU-6f1a3b57-0000-4000-8000-000000000001"


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HAMI, *args], capture_output=True, text=True, timeout=timeout, check=False, env=env)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The failure a user sees: non-zero, no traceback, one line on stderr."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


# --- hami status: what it lists ---------------------------------------------------------------------------------


def _node() -> Node:
    card = DeviceInfo(id=UUID, count=10, devmem=81920, devcore=100, type="NVIDIA A100-SXM4-80GB", numa=0)
    return Node(metadata=ObjectMeta(name="gpu-node-0", annotations={NODE_REGISTER: encode_node_devices([card])}))


def _pod(name: str, *, limits: dict[str, str], node: str = "", phase: str = "Pending", **annotations: str) -> Pod:
    return Pod(
        metadata=ObjectMeta(name=name, namespace="team", uid=f"uid-{name}", annotations=annotations),
        spec=PodSpec(
            node_name=node,
            scheduler_name=DEFAULT_SCHEDULER_NAME,
            containers=(Container(name="main", resources=ResourceRequirements(limits=limits)),),
        ),
        status=PodStatus(phase=phase, reason="OOMKilled" if phase == FAILED else ""),
    )


def _held(mem: int, cores: int) -> str:
    return encode_pod_devices([[ContainerDevice(uuid=UUID, type="NVIDIA", usedmem=mem, usedcores=cores)]])


def test_status_lists_failed_pods_and_requests_it_cannot_read_without_counting_them() -> None:
    pods = [
        _pod("running", limits={"nvidia.com/gpu": "1"}, node="gpu-node-0", phase="Running",
             **{DEVICES_ALLOCATED: _held(3000, 30), BIND_PHASE: "success"}),
        _pod("crashed", limits={"nvidia.com/gpu": "1"}, node="gpu-node-0", phase=FAILED,
             **{DEVICES_ALLOCATED: _held(5000, 50), BIND_PHASE: "success"}),
        _pod("too-much", limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3Gi"}),
        _pod("finished", limits={"nvidia.com/gpu": "1"}, node="gpu-node-0", phase="Succeeded",
             **{DEVICES_ALLOCATED: _held(7000, 70)}),
    ]  # fmt: skip
    view = build_overview("https://api", [_node()], pods, [], fleet=Fleet())
    rows = {row.pod: row for row in view.pods}
    assert set(rows) == {"team/running", "team/crashed", "team/too-much"}  # a Succeeded pod is gone
    assert rows["team/crashed"].state == FAILED
    assert rows["team/crashed"].reason == "OOMKilled"
    assert rows["team/too-much"].state == UNREADABLE
    assert "nvidia.com/gpumem" in rows["team/too-much"].reason
    (gpu,) = view.gpus
    # only the running pod holds the card: a failed pod's devices are free again, as HAMi counts them
    assert (gpu.vendor, gpu.memory_booked_mib, gpu.cores_booked, gpu.pods) == (NVIDIA, 3000, 30, ["team/running"])
    table = status.render_overview(view)
    assert "Unreadable: " in table
    assert "Failed: OOMKilled" in table


def test_short_ids_cut_uuids_only() -> None:
    assert short_uuid(UUID) == UUID[:12]
    assert short_uuid("ASCEND-c74a222f-ee24-59dd-a97f-927b11818b68") == "ASCEND-c74a2"
    # Cambricon's invented ids share their first 12 characters on a node: shown whole
    assert short_uuid("cambricon-node-0-cambricon-mlu-1") == "cambricon-node-0-cambricon-mlu-1"


@pytest.mark.timeout(240)
def test_status_and_the_start_up_table_show_every_vendor(tmp_path: Path) -> None:
    stack = subprocess.Popen(
        [HAMI, "up", "--kube", "emulated", "--workdir", str(tmp_path), "--nodes", "1", "--gpus", "2",
         "--mig-nodes", "0", "--metrics-port", "0", "--vendors", "nvidia,ascend,cambricon,hygon", "--for", "180"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert stack.stdout is not None
        seen = []
        for line in stack.stdout:
            seen.append(line)
            if READY in line:
                break
        else:
            pytest.fail(f"hami up ended early: {''.join(seen)}")
        start_up = "".join(seen)
        devices = start_up.split("Devices:", 1)[1]
        for node in ("gpu-node-0", "ascend-node-0", "cambricon-node-0", "hygon-node-0"):
            assert node in devices, start_up
        done = run("status", "--dir", str(tmp_path), "-o", "json")
        assert done.returncode == 0, done.stderr
        view = msgspec.json.decode(done.stdout, type=status.Overview)
        vendors = {gpu.node: gpu.vendor for gpu in view.gpus}
        assert vendors["gpu-node-0"] == NVIDIA
        assert vendors["ascend-node-0"].startswith("Ascend910")
        assert (vendors["cambricon-node-0"], vendors["hygon-node-0"]) == ("MLU", "DCU")
        held = {gpu.node: gpu.pods for gpu in view.gpus if gpu.pods}
        assert held["ascend-node-0"] == ["default/ascend-vnpu"]
        assert held["cambricon-node-0"] == ["default/cambricon-smlu"]
        assert held["hygon-node-0"] == ["default/hygon-vdcu"]
        pods = {row.pod: row for row in view.pods}
        _decode_every_family_key_the_stack_wrote(tmp_path)
        assert pods["default/hygon-vdcu"].devices
        assert pods["default/hygon-vdcu"].state == "success"
        assert pods["default/ascend-vnpu"].devices
        assert pods["default/cambricon-smlu"].devices
    finally:
        stack.send_signal(signal.SIGINT)
        stack.communicate(timeout=120)
    assert stack.returncode == 0


def _decode_every_family_key_the_stack_wrote(workdir: Path) -> None:
    """`hami decode` explains every vendor annotation on the stack's nodes and pods, as written there."""
    kubeconfig = read_state(workdir).kubeconfig
    kubectl = str(Path(sys.executable).parent / "kubectl")
    objects = []
    for kind in ("nodes", "pods"):
        listed = subprocess.run(
            [kubectl, "--kubeconfig", kubeconfig, "get", kind, "-A", "-o", "json"],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        objects += json.loads(listed.stdout)["items"]
    vendor_keys = family_decoders(default_fleet().families)
    seen = set()
    for obj in objects:
        for key, value in (obj["metadata"].get("annotations") or {}).items():
            if key not in vendor_keys:
                continue
            done = run("decode", key, value)
            assert done.returncode == 0, (key, value, done.stderr)
            seen.add(key)
    # the registrations of Ascend and Hygon and the device lists of every vendor pod were among them
    assert any("node-register" in key for key in seen), seen
    assert any(key.endswith("-devices-allocated") for key in seen), seen


# --- one line, never a traceback ------------------------------------------------------------------------------


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    return path


@pytest.mark.parametrize(
    ("make", "extra", "says"),
    [
        (lambda d: d / "absent", [], "no such file"),
        (lambda d: _write(d / "kc", "clusters: [\n"), [], "is not valid YAML"),
        (lambda d: _write(d / "kc", "apiVersion: v1\nclusters: 5\n"), [], "kubeconfig"),
        (lambda d: _kubeconfig(d / "kc", "https://127.0.0.1:1"), ["--context", "nope"], "context 'nope'"),
        (lambda d: _kubeconfig(d / "kc", "https://127.0.0.1:1"), [], "cannot reach the Kubernetes API"),
    ],
    ids=["missing", "not-yaml", "malformed", "unknown-context", "unreachable"],
)
def test_status_explains_a_bad_kubeconfig_or_a_dead_cluster_in_one_line(
    tmp_path: Path, make: Callable[[Path], Path], extra: list[str], says: str
) -> None:
    line = one_line_error(run("status", "--kubeconfig", str(make(tmp_path)), "--timeout", "3", *extra))
    assert line.startswith("hami status: ")
    assert says in line


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_up_says_in_one_line_when_a_peer_will_not_start(tmp_path: Path) -> None:
    # "built" peers that die at once: the real control plane cannot come up
    for name in PEERS:
        peer = tmp_path / "bin" / name
        peer.parent.mkdir(exist_ok=True)
        peer.write_text("#!/bin/sh\necho 'cannot start' >&2\nexit 3\n")
        peer.chmod(0o755)
    env = {**os.environ, BIN_ENV: str(tmp_path / "bin")}
    done = run("up", "--kube", "real", "--workdir", str(tmp_path / "w"), "--nodes", "1", "--for", "1", env=env,
               timeout=300)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    failure = [line for line in done.stdout.splitlines() if line.startswith("hami up: could not start:")]
    assert len(failure) == 1, done.stdout
    assert (tmp_path / "w" / "hami-up.log").read_text().count("Traceback") >= 1  # the details are in the log


def test_version() -> None:
    done = run("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("hami ")
    assert done.stdout.split()[1][0].isdigit()


# --- help -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", [up, submit, status, decode], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_option_with_a_default_shows_it_in_help(module: object) -> None:
    parser: argparse.ArgumentParser = module.parser()  # type: ignore[attr-defined]
    assert parser.formatter_class is DefaultsHelp
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
            continue
        flags = ", ".join(action.option_strings)
        shown = " ".join((action.help or "").split())
        assert "default" in shown.lower() or f"(default: {action.default})" in text, flags


# --- start-up: only what status needs ---------------------------------------------------------------------------


def test_status_imports_neither_the_stack_nor_the_services() -> None:
    probe = (
        "import sys, hami_cli.main, hami_cli.status\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'hami_sim', 'httpx', 'fastapi', 'uvicorn', 'nats', 'grpc', 'hami_webhook', 'hami_extender'})\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


# --- leaving nothing behind -------------------------------------------------------------------------------------


@pytest.fixture
def own_tmp(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A TMPDIR of the test's own, so whatever `hami up` leaves there is seen."""
    root = tmp_path / "tmp"
    root.mkdir()
    return root, {**os.environ, "TMPDIR": str(root)}


def _leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())


@pytest.mark.timeout(240)
def test_up_removes_its_work_directory_and_fake_mig_state_unless_kept(own_tmp: tuple[Path, dict[str, str]]) -> None:
    root, env = own_tmp
    flags = ["up", "--kube", "emulated", "--nodes", "1", "--gpus", "1", "--mig-nodes", "1", "--mig-gpus", "1",
             "--metrics-port", "0", "--examples", str(ROOT / "examples" / "mig.yaml"), "--for", "2"]  # fmt: skip
    done = run(*flags, env=env, timeout=200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "removed its work directory" in done.stdout
    assert _leftovers(root) == []
    kept = run(*flags, "--keep", env=env, timeout=200)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert any(name.endswith("hami-up.log") for name in _leftovers(root))
    assert not any("hami-fake-mig" in name for name in _leftovers(root))  # the fake driver's state is not the run's


def test_json_of_the_overview_is_what_scripts_read() -> None:
    view = build_overview("https://api", [_node()], [], [], fleet=Fleet())
    decoded = json.loads(msgspec.json.encode(view))
    assert decoded["gpus"][0]["vendor"] == NVIDIA
    assert decoded["pods"] == []


def test_decode_knows_every_key_of_every_shipped_family() -> None:
    families = default_fleet().families
    assert {f.word for f in families} >= {"MLU", "DCU"}
    assert any(f.word.startswith("Ascend910") for f in families)
    known = decode.all_decoders()
    for family in families:
        keys = {family.node_lock.key, *family.owned_annotations, *family.user_annotations}
        keys |= {k for k in (family.register_key, family.handshake_key) if k}
        assert keys <= set(known), (family.word, sorted(keys - set(known)))
