"""Every command the docs tell a user to type is run here as written, so a command that changes in a doc is a
test that changes.

The commands are the lines of the fenced shell blocks (```sh, ```bash, ```shell; in ```console only the
lines after a ``$ ``) of README.md, docs/*.md and examples/*/README.md, with their ``# comments`` cut off.
Each doc's commands run in order from the checkout's root, as one user in a fresh shell would: a ``hami up``
or ``make run`` line is started, waited for and interrupted with Ctrl-C at the end of the doc; an ``export``
sets the variable for the next lines; ``<printed path>`` and its kin stand for what the doc says the user
reads off the screen. The few commands that cannot run on this machine are in ``NOT_RUN``, each with its
reason; a command that is neither run nor listed cannot exist, since every other one is run.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pytest

from tests.realk8s.conftest import binaries_or_skip

ROOT: Final = Path(__file__).resolve().parent.parent
VENV_BIN: Final = Path(sys.executable).parent
SHELL_FENCES: Final = frozenset({"sh", "bash", "shell", "console"})
READY: Final = "adds pods"  # the line `hami up` prints once it serves
STOP_S: Final = 120.0  # Ctrl-C to exit of a real stack on a loaded 2-core machine
SETTLE_S: Final = 120.0  # the longest a command of EVENTUALLY is asked again until it shows what the doc says
KUBECONFIG_LINE: Final = re.compile(r"^kubeconfig:\s+(\S+)", re.MULTILINE)
PLACEHOLDER: Final = re.compile(r"<[a-z]+(?:[ -][a-z]+)*>")
FENCE: Final = re.compile(r"^```\s*(\w*)")

# command (as written, comment cut off) -> why it is not run here
NOT_RUN: Final[dict[str, str]] = {
    "make test": "is the whole suite, this test among it",
    "make k8s": "builds etcd, kube-apiserver, kube-scheduler and the kubelet from Go (minutes); `make test` runs "
    "it first, and every other command here uses what it built",
    "kubectl label node <gpu-node> gpu=on": "needs a real cluster with a GPU node (the local stack's nodes are "
    "simulated and carry no gpu=on selector to test)",
    "kubectl apply -k deploy/kustomize/overlays/otel": "needs a real cluster that can pull the images and run the "
    "DaemonSet on GPU nodes; tests/realk8s runs what it renders",
    "docker compose up --build -d": "needs Docker and the k3s image",
    "docker compose cp k3s:/output/kubeconfig.yaml ./kubeconfig": "needs the compose stack (Docker, k3s)",
    "export KUBECONFIG=$PWD/kubeconfig": "the compose stack's kubeconfig (Docker, k3s)",
    "kubectl apply -f deploy/compose/sample-pod.yaml": "needs the compose stack (Docker, k3s)",
    "curl -s localhost:31993/metrics | grep hami_vgpu_memory_allocated_bytes": "the compose stack's metrics "
    "(Docker, k3s)",
    "helm upgrade hami hami-charts/hami -n kube-system --reuse-values "
    "--set-string scheduler.nodeLabelSelector.gpu=on": "needs helm and a cluster where HAMi's chart is installed",
}

# commands that write into the checkout's deploy/ folder: run as written in a copy of it
IN_DEPLOY_COPY: Final = frozenset(
    {
        "deploy/generate-secrets.sh --tls deploy/kustomize/overlays/dev",
        "kubectl kustomize deploy/kustomize/overlays/otel | less",
    }
)


def _lines_with(word: str, out: str) -> int:
    return sum(word in line for line in out.splitlines())


def _running(at_least: int) -> Callable[[str], bool]:
    return lambda out: _lines_with(" Running ", out) >= at_least


# command -> what its output shows once the cluster has done what the doc's comment says: asked again (as a
# user would) until it does
EVENTUALLY: Final[dict[str, Callable[[str], bool]]] = {
    "kubectl get pods": _running(10),  # examples/preemption: ten batch pods Running, the GPU full
    "kubectl get events --field-selector reason=Preempted": lambda out: _lines_with("Preempted", out) == 3,
    "kubectl get pod urgent -o wide": _running(1),
}


@dataclass(frozen=True)
class DocCommand:
    doc: str  # relative to the checkout
    line: int
    text: str  # as written, without its comment

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("examples/*/README.md"))]


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _cut_comment(line: str) -> str:
    """The line without a shell comment: a ``#`` that starts a word outside quotes."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands_of(path: Path) -> list[DocCommand]:
    found: list[DocCommand] = []
    fence: str | None = None
    pending = ""
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        opened = FENCE.match(raw)
        if opened:
            fence = None if fence is not None else opened.group(1).lower()
            continue
        if fence not in SHELL_FENCES:
            continue
        line = raw.strip()
        if fence == "console":
            if not line.startswith("$ "):
                continue  # the output the doc shows
            line = line[2:]
        text = _cut_comment(line)
        if not text and not pending:
            continue
        if not pending:
            start = number
        if text.endswith("\\"):
            pending += text[:-1].rstrip() + " "
            continue
        found.append(DocCommand(_name(path), start, (pending + text).strip()))
        pending = ""
    return found


def all_commands() -> list[DocCommand]:
    return [command for path in docs() for command in commands_of(path)]


def _long_running(text: str) -> bool:
    """`hami up` and `make run` serve until Ctrl-C (unless told --for or asked for --help)."""
    words = text.split()
    serves = words[:2] == ["make", "run"] or words[:2] in (["./hami", "up"], ["hami", "up"])
    return serves and "--help" not in words and "--for" not in words


# --- the check that needs no cluster ------------------------------------------------------------------------


def test_every_doc_command_is_run_or_listed_with_its_reason() -> None:
    commands = all_commands()
    texts = {c.text for c in commands}
    by_doc = {c.doc for c in commands}
    assert {"README.md", "examples/preemption/README.md"} <= by_doc  # the extraction finds the fenced blocks
    stale = sorted((set(NOT_RUN) | IN_DEPLOY_COPY | set(EVENTUALLY)) - texts)
    assert not stale, f"listed here but in no doc any more (update the tables): {stale}"
    for command in commands:
        if command.text in NOT_RUN:
            continue
        unknown = set(PLACEHOLDER.findall(command.text)) - set(_placeholders("x"))
        assert not unknown, f"{command}: nothing to put for {sorted(unknown)}; add it to _placeholders or NOT_RUN"


def test_the_extraction_reads_blocks_as_a_shell_does(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n```sh\nmake run    # comment\n# only a comment\n\ngrep '#x' f \\\n  --count\n```\n"
        "```yaml\nkey: value\n```\n```console\n$ ./hami status\nNODE GPU\n```\n```\nnot a shell block\n```\n"
    )
    assert [(c.line, c.text) for c in commands_of(doc)] == [
        (3, "make run"),
        (6, "grep '#x' f --count"),
        (13, "./hami status"),
    ]


# --- running them -------------------------------------------------------------------------------------------


def _placeholders(kubeconfig: str) -> dict[str, str]:
    """What the user reads off the screen and types in place of the doc's <...>."""
    return {"<printed path>": kubeconfig, "<that path>": kubeconfig}


@dataclass
class _Shell:
    """One user's terminals: the environment of a fresh shell at the checkout's root, what runs in the
    background, and what the stacks printed."""

    env: dict[str, str]
    deploy_copy: Path
    served: list[tuple[str, subprocess.Popen[str]]] = field(default_factory=list)
    kubeconfig: str = ""

    def expand(self, text: str) -> str:
        for placeholder, value in _placeholders(self.kubeconfig).items():
            if placeholder in text:
                assert value, f"{text}: no stack has printed its kubeconfig yet"
                text = text.replace(placeholder, value)
        return text

    def run(self, command: DocCommand) -> None:
        text = self.expand(command.text)
        if text.startswith("export "):
            name, _, value = text.removeprefix("export ").partition("=")
            self.env[name] = os.path.expandvars(value)
            return
        if _long_running(text):
            self.serve(command, text)
            return
        cwd = self.deploy_copy if command.text in IN_DEPLOY_COPY else ROOT
        wanted = EVENTUALLY.get(command.text)
        deadline = time.monotonic() + SETTLE_S
        while True:
            done = subprocess.run(
                ["bash", "-o", "pipefail", "-c", text],
                cwd=cwd, env=self.env, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            assert done.returncode == 0, f"{command}\nrc {done.returncode}\n{done.stdout}\n{done.stderr}"
            assert "Traceback" not in done.stdout + done.stderr, f"{command}\n{done.stderr}"
            if wanted is None or wanted(done.stdout):
                return
            if time.monotonic() > deadline:
                pytest.fail(f"{command}: never showed what the doc says:\n{done.stdout}")
            time.sleep(2)

    def serve(self, command: DocCommand, text: str) -> None:
        up = subprocess.Popen(
            ["bash", "-c", f"exec {text}"],
            cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        self.served.append((str(command), up))
        assert up.stdout is not None
        seen = []
        for line in up.stdout:
            seen.append(line)
            if READY in line:
                break
        else:
            up.wait()
            pytest.fail(f"{command}: ended (rc {up.returncode}) before it served:\n{''.join(seen)}")
        printed = KUBECONFIG_LINE.search("".join(seen))
        assert printed, f"{command}: printed no kubeconfig:\n{''.join(seen)}"
        self.kubeconfig = printed.group(1)

    def stop_all(self) -> None:
        """Ctrl-C to each, as a terminal sends it; each must stop cleanly and say so."""
        for what, up in self.served:
            if up.poll() is not None:
                continue
            os.killpg(up.pid, signal.SIGINT)
            try:
                rest, _ = up.communicate(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
                rest, _ = up.communicate()
                pytest.fail(f"{what}: did not stop within {STOP_S:.0f} s of Ctrl-C:\n{rest}")
            assert "Traceback" not in rest, f"{what}:\n{rest}"
            assert "stopped." in rest, f"{what}:\n{rest}"
            if not what.split(": ", 1)[1].startswith("make "):  # make reports its child's Ctrl-C as its own
                assert up.returncode == 0, f"{what}: rc {up.returncode}\n{rest}"

    def kill_all(self) -> None:
        for _, up in self.served:
            if up.poll() is None:
                os.killpg(up.pid, signal.SIGKILL)
                up.communicate()


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[_Shell]:
    k8s = binaries_or_skip()  # the docs' stacks are real by default, and kubectl is the built one
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join((str(k8s.folder), str(VENV_BIN), env.get("PATH", "/usr/bin:/bin")))
    env["TMPDIR"] = str(tmp_path)  # each `hami up` work directory (and where `hami status` looks) is this test's
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "deploy", copy / "deploy", ignore=shutil.ignore_patterns("secrets"))
    running = _Shell(env=env, deploy_copy=copy)
    try:
        yield running
    finally:
        running.kill_all()


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "doc", [str(p.relative_to(ROOT)) for p in docs() if any(c.text not in NOT_RUN for c in commands_of(p))]
)
def test_the_commands_of_each_doc_run_as_written(doc: str, shell: _Shell) -> None:
    for command in commands_of(ROOT / doc):
        if command.text not in NOT_RUN:
            shell.run(command)
    shell.stop_all()
