"""The operator's ``hami`` command, run as a user would run it."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hami_cli.decode import DECODERS
from hami_cli.main import COMMANDS
from hami_cli.state import STATE_FILE
from hami_sim.realk8s import BIN_ENV

ROOT = Path(__file__).resolve().parent.parent
HAMI = str(Path(sys.executable).parent / "hami")
WRAPPER = str(ROOT / "hami")  # what the README runs: ./hami, without activating .venv
EXAMPLES = ROOT / "examples"
KEYS = ROOT / "libs" / "hami_common" / "annotations" / "keys.py"
READY = "adds pods"


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
        "up", "--kube", "emulated", "--workdir", str(tmp_path), "--nodes", "2", "--gpus", "2", "--metrics-port", "0",
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


def test_up_without_the_real_peers_runs_the_emulator_and_says_how_to_build_them(tmp_path: Path) -> None:
    env = {**os.environ, BIN_ENV: str(tmp_path / "not-built")}
    done = subprocess.run(
        [HAMI, "up", "--workdir", str(tmp_path / "run"), "--nodes", "1", "--gpus", "1", "--mig-nodes", "0",
         "--metrics-port", "0", "--no-examples", "--for", "0.1"],
        capture_output=True, text=True, env=env, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if "make k8s" in line]
    assert len(said) == 1, done.stdout
    assert "emulator" in said[0]
    assert "emulated Kubernetes" in done.stdout
    assert "Kubernetes:  http://127.0.0.1:" in done.stdout  # the emulator speaks plain HTTP, kube-apiserver TLS


def test_up_kube_real_without_the_real_peers_says_so_in_one_line_and_fails(tmp_path: Path) -> None:
    env = {**os.environ, BIN_ENV: str(tmp_path / "not-built")}
    done = subprocess.run(
        [HAMI, "up", "--kube", "real", "--workdir", str(tmp_path / "run")],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert "--kube real" in lines[0]
    assert "make k8s" in lines[0]
    assert not (tmp_path / "run" / STATE_FILE).exists()  # nothing started, so nothing for `hami status` to find


def test_submit_without_a_running_stack_says_so(tmp_path: Path) -> None:
    done = run("submit", "-f", str(EXAMPLES / "memory-mib.yaml"), "--dir", str(tmp_path))
    assert done.returncode == 1
    assert "no running `hami up`" in done.stderr


def test_status_without_a_running_stack_says_so(tmp_path: Path) -> None:
    done = run("status", "--workdir", str(tmp_path))
    assert done.returncode == 1
    assert "no running `hami up`" in done.stderr


@pytest.mark.timeout(150)
def test_status_from_another_terminal_shows_placements_and_why_a_pod_is_pending(tmp_path: Path) -> None:
    up = subprocess.Popen(
        [HAMI, "up", "--kube", "emulated", "--workdir", str(tmp_path), "--nodes", "2", "--gpus", "2",
         "--metrics-port", "0", "--examples", str(EXAMPLES), "--for", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        for line in up.stdout:
            if READY in line:
                break
        else:
            pytest.fail(f"hami up ended early: {up.stderr.read() if up.stderr else ''}")
        done = run("status", "--workdir", str(tmp_path))
        assert done.returncode == 0, done.stderr
        rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("default/")}
        assert "success" in rows["default/memory-mib"]
        assert "Pending" in rows["default/cannot-fit"]
        assert "CardInsufficientMemory" in rows["default/cannot-fit"]
        # the MIG node's instances: each MIG example's profile, its placement and the device created for it
        assert "success" in rows["default/mig-small"]
        instances = {line.split()[-1]: line.split() for line in done.stdout.splitlines() if " MIG-" in line}
        assert instances["mig-small"][:3] == ["mig-node-0", instances["mig-small"][1], "1g.10gb"]
        assert instances["mig-large"][2] == "1g.20gb"  # 2g.20gb has the same memory and more slices
        # the examples again (as the README's second terminal does while `make run` runs): nothing new, no error
        again = run("submit", "-f", str(EXAMPLES / "memory-mib.yaml"), "--dir", str(tmp_path))
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == "pod/memory-mib unchanged (already exists)"
    finally:
        up.send_signal(signal.SIGINT)
        out, _ = up.communicate(timeout=60)
    assert up.returncode == 0
    assert out.rstrip().endswith("stopped.")


def test_the_wrapper_at_the_root_runs_hami_without_an_activated_venv() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
    env["PATH"] = "/usr/bin:/bin"  # no .venv/bin: as in a fresh terminal
    done = subprocess.run([WRAPPER, "--help"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    for command in COMMANDS:  # each subcommand is named and described
        assert f"  {command}  " in done.stdout or f"  {command} " in done.stdout
    assert "GPU overview" in done.stdout


@pytest.mark.parametrize("command", ["up", "submit", "status", "decode"])
def test_each_command_has_its_own_help(command: str) -> None:
    done = run(command, "--help")
    assert done.returncode == 0, done.stderr
    assert f"usage: hami {command}" in done.stdout


def _keys_of_keys_py() -> dict[str, str]:
    """Every annotation or label key written in keys.py (names whose value has a '/'), read from its source."""
    found = {}
    for node in ast.parse(KEYS.read_text()).body:
        if (
            (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(node.value, ast.Constant)
            )
            and isinstance(node.value.value, str)
            and "/" in node.value.value
        ):
            found[node.target.id] = node.value.value
    return found


def test_decode_knows_every_key_the_project_knows() -> None:
    keys = _keys_of_keys_py()
    assert len(keys) > 20
    assert sorted(set(keys.values()) - set(DECODERS)) == []


def test_decode_of_the_vgpu_node_annotation() -> None:
    done = run("decode", "hami.io/vgpu-node", "gpu-node-1")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == "gpu-node-1"


@pytest.mark.parametrize(
    "key",
    [
        "hami.io/vgpu-devices-allocated",
        "hami.io/vgpu-devices-to-allocate",
        "hami.io/trace-context",
        "hami.io/vgpu-grant",
        "hami.io/bind-phase",
        "hami.io/node-handshake",
        "hami.io/vgpu-node",
        "nvidia.com/numa-bind",
    ],
)
def test_decode_refuses_garbage(key: str) -> None:
    done = run("decode", key, "garbage!")
    assert done.returncode == 1
    assert key in done.stderr


def test_decode_of_a_trace_context() -> None:
    done = run("decode", "hami.io/trace-context", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["trace_id"] == "0af7651916cd43dd8448eb211c80319c"


def test_status_and_submit_pick_the_run_or_ask_which(tmp_path: Path) -> None:
    """Several runs: each in its own folder; a dead one is ignored; two live ones make the command ask."""
    from hami_cli.state import NoStackError, UpState, pick_running, write_state

    def state(pid: int) -> UpState:
        return UpState(api_url="http://x", kubeconfig="k", webhook_url="w", ca_file="c", metrics_url="m",
                       nats_url="n", pid=pid)  # fmt: skip

    with pytest.raises(NoStackError, match="no running `hami up`"):
        pick_running(None, tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for name, pid in (("a", os.getpid()), ("b", int(dead.stdout))):
        (tmp_path / name).mkdir()
        write_state(tmp_path / name, state(pid))
    assert pick_running(None, tmp_path)[0] == tmp_path / "a"
    (tmp_path / "c").mkdir()
    write_state(tmp_path / "c", state(os.getppid()))
    with pytest.raises(NoStackError, match="choose one") as err:
        pick_running(None, tmp_path)
    assert f"--dir {tmp_path / 'a'}" in str(err.value)
    assert f"--dir {tmp_path / 'c'}" in str(err.value)
    assert pick_running(tmp_path / "c", tmp_path)[1].pid == os.getppid()
    with pytest.raises(NoStackError, match="has ended"):
        pick_running(tmp_path / "b", tmp_path)


def _start_up(workdir: Path | None, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    flags = ["--workdir", str(workdir)] if workdir else []
    return subprocess.Popen(
        [HAMI, "up", "--kube", "emulated", *flags, "--nodes", "2", "--gpus", "2", "--metrics-port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env,
    )  # fmt: skip


def _wait_ready(up: subprocess.Popen[str]) -> str:
    assert up.stdout is not None
    seen = []
    for line in up.stdout:
        seen.append(line)
        if READY in line:
            return "".join(seen)
    pytest.fail(f"hami up ended early: {''.join(seen)} {up.stderr.read() if up.stderr else ''}")


STOP_S = 120.0  # a loaded machine (the whole suite on 2 cores) has taken over 60 s once; alone it takes ~1 s


@pytest.fixture
def two_stacks(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], subprocess.Popen[str]]]:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the default run folders go under this test's folder
    ups = [_start_up(None, "--no-examples", "--mig-nodes", "0", env=env) for _ in range(2)]
    try:
        for up in ups:
            _wait_ready(up)
        yield ups[0], ups[1]
    finally:
        for up in ups:
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGINT)
                try:
                    up.communicate(timeout=STOP_S)
                except subprocess.TimeoutExpired:
                    os.killpg(up.pid, signal.SIGKILL)
                    out, _ = up.communicate()
                    logs = "\n".join(p.read_text()[-3000:] for p in tmp_path.glob("hami-up-*/*/hami-up.log"))
                    raise AssertionError(f"hami up did not stop within {STOP_S:.0f} s:\n{out}\n{logs}") from None


@pytest.mark.timeout(240)
def test_two_stacks_run_side_by_side_and_status_asks_which(
    tmp_path: Path, two_stacks: tuple[subprocess.Popen[str], subprocess.Popen[str]]
) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    root = tmp_path / f"hami-up-{os.getuid()}"
    folders = sorted(p for p in root.iterdir() if (p / "hami-up.json").exists())
    assert len(folders) == 2  # each run its own kubeconfig, inventory and state
    done = subprocess.run([HAMI, "status"], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 1
    assert "2 `hami up` stacks are running" in done.stderr
    for folder in folders:
        # the used columns come from the metrics service, which hears each GPU's first sample a moment after
        # the stack is up (later on a loaded machine): ask again until every GPU has one
        deadline = time.monotonic() + 60
        while True:
            shown = subprocess.run([HAMI, "status", "--dir", str(folder), "-o", "json"], capture_output=True,
                                   text=True, env=env, timeout=60, check=False)  # fmt: skip
            assert shown.returncode == 0, shown.stderr
            view = json.loads(shown.stdout)
            assert len(view["gpus"]) == 4
            assert view["metrics"] == "ok"
            if all(g["memory_used_mib"] is not None for g in view["gpus"]) or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert all(g["memory_used_mib"] is not None for g in view["gpus"]), view["gpus"]
    first, _ = two_stacks
    os.killpg(first.pid, signal.SIGINT)
    first.communicate(timeout=60)
    done = subprocess.run([HAMI, "status", "-o", "json"], capture_output=True, text=True, env=env, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr  # the one left is picked without --dir


@pytest.mark.timeout(150)
def test_ctrl_c_stops_quietly_and_says_what_it_waits_for(tmp_path: Path) -> None:
    """Ctrl-C reaches the whole process group, as a terminal sends it; an OTLP collector that is down."""
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    up = _start_up(tmp_path, "--no-examples", env=env)
    _wait_ready(up)
    os.killpg(up.pid, signal.SIGINT)
    out, err = up.communicate(timeout=60)
    assert up.returncode == 0
    assert "Traceback" not in err
    assert "KeyboardInterrupt" not in err
    assert "stopping: the scheduler, NATS, 2 nodes" in out
    assert "sending the last spans to http://127.0.0.1:9 (at most 1 s)" in out
    assert out.rstrip().endswith("stopped.")
    log = (tmp_path / "hami-up.log").read_text()
    stop = log.split("stopping NATS before the services", 1)
    assert len(stop) == 2
    noisy = [
        line
        for line in stop[1].splitlines()
        if (" WARNING " in line or " ERROR " in line) and "opentelemetry" not in line  # the collector is down
    ]
    assert noisy == []
    assert not (tmp_path / "hami-up.json").exists()  # `hami status` now says none runs here


MIXED_YAML = """\
apiVersion: v1
kind: Namespace
metadata: {name: team-x}
---
apiVersion: v1
kind: ResourceQuota
metadata: {name: gpu-quota, namespace: team-x}
spec: {hard: {limits.nvidia.com/gpumem: "8000"}}
---
apiVersion: v1
kind: Namespace
metadata: {name: default}
"""
LIST_YML = """\
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Pod
    metadata: {name: trainer, namespace: team-x}
    spec:
      schedulerName: hami-scheduler
      containers:
        - name: main
          image: busybox
          resources: {limits: {nvidia.com/gpu: "1", nvidia.com/gpumem: "2000"}}
  - apiVersion: policy/v1
    kind: PodDisruptionBudget
    metadata: {name: trainer, namespace: team-x}
    spec: {minAvailable: 1, selector: {matchLabels: {app: trainer}}}
"""
DEPLOYMENT_JSON = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web"},
    "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "web", "image": "nginx"}]}}},
}


@pytest.mark.timeout(150)
def test_submit_applies_every_kind_it_can_and_reports_each_object(tmp_path: Path) -> None:
    """A folder as kubectl reads it: a .yaml with several documents, a .yml holding a List, a .json; each object
    reported on its own line, an existing one left unchanged, a kind the emulator does not serve skipped with
    the reason (and rc 1, as kubectl fails on what it cannot apply)."""
    import httpx

    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "a-namespace.yaml").write_text(MIXED_YAML)
    (manifests / "b-workload.yml").write_text(LIST_YML)
    (manifests / "c-deployment.json").write_text(json.dumps(DEPLOYMENT_JSON))
    (manifests / "notes.txt").write_text("not a manifest")
    up = _start_up(tmp_path / "stack", "--no-examples")
    try:
        _wait_ready(up)
        done = run("submit", "-f", str(manifests), "--dir", str(tmp_path / "stack"))
        state = json.loads((tmp_path / "stack" / "hami-up.json").read_text())
        with httpx.Client(base_url=state["api_url"], timeout=10) as api:
            quota = api.get("/api/v1/namespaces/team-x/resourcequotas/gpu-quota")
            pod = api.get("/api/v1/namespaces/team-x/pods/trainer")
            pdb = api.get("/apis/policy/v1/namespaces/team-x/poddisruptionbudgets/trainer")
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.communicate(timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines() == [
        "namespace/team-x created",  # namespaces first, pods last: the quota is there before the pod
        "namespace/default unchanged (already exists)",
        "resourcequota/gpu-quota created",
        "poddisruptionbudget/trainer created",
        "pod/trainer created",
    ]
    assert "deployment/web skipped: apps/v1 Deployment is not served by this stack's apiserver" in done.stderr
    assert quota.status_code == pod.status_code == pdb.status_code == 200
    assert "hami.io/trace-context" in pod.json()["metadata"]["annotations"]  # it went through the webhook


async def test_a_task_that_ignores_its_cancellation_is_named_instead_of_hanging_the_stop() -> None:
    """Once every service has stopped, hami up cancels what is left; a task that swallows its cancellation (as
    one did once under load, leaving a hami up that never exited) is reported by name, and the stop goes on."""
    from hami_cli.up import end_stragglers

    async def polite() -> None:
        await asyncio.Event().wait()

    release = asyncio.Event()

    async def stubborn() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # the bug: a retry loop that treats a stop as one more failure

    tasks = [asyncio.create_task(polite(), name="polite"), asyncio.create_task(stubborn(), name="stubborn")]
    await asyncio.sleep(0)
    stuck = await end_stragglers(0.5)
    assert [name.split(" ")[0] for name in stuck] == ["stubborn"]
    assert tasks[0].cancelled()
    release.set()
    tasks[1].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
