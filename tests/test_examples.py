"""`hami up` as `make run` starts it, with every default: each file of examples/ lands as its comment says, and
the README's second terminal works beside it.

What each example must get is read from the example itself: its limits (count, MiB or percentage, cores), its
annotations (a card's UUID or type, NUMA binding, MIG mode) and, for MIG, the profile its comment names
(``# -> 1g.10gb``). Where a pod landed is read back as a user would: the pods' and nodes' annotations through
the stack's kubeconfig, and kube-scheduler's (or the stand-in's) FailedScheduling Event for a pod left pending.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from hami_cli.state import read_state
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_SUCCESS,
    DEVICES_ALLOCATED,
    MIG_ALLOCATIONS,
    NODE_REGISTER,
    NOUSE_GPUTYPE,
    NUMA_BIND,
    USE_GPUTYPE,
    USE_GPUUUID,
    VGPU_MODE,
    decode_mig_allocations,
    decode_node_devices,
    decode_pod_devices,
)
from hami_common.annotations.registration import MODE_MIG, DeviceInfo
from hami_common.kube import FAILED_SCHEDULING, KubeClient, KubeSettings, Pod
from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY, GPU_MEMORY_PERCENTAGE
from hami_sim.waiting import eventually
from tests.realk8s.conftest import binaries_or_skip
from tests.test_cli import HAMI, STOP_S, _wait_ready
from tests.test_doc_commands import VENV_BIN, DocCommand, commands_of

ROOT: Final = Path(__file__).resolve().parent.parent
EXAMPLES: Final = ROOT / "examples"
README: Final = ROOT / "README.md"
SECOND_TERMINAL: Final = "While `make run` runs, in a second terminal"  # the README's paragraph before the block
MIG_PROFILE: Final = re.compile(r"#\s*->\s*(\d+g\.\d+gb)\b")  # mig.yaml: "nvidia.com/gpumem: 8000  # -> 1g.10gb"
SETTLE_S: Final = 90.0  # `hami up` waits 30 s for its examples; a loaded 2-core machine may need longer


@dataclass(frozen=True)
class Example:
    file: str
    pod: dict[str, Any]
    text: str  # the document as written, comments included

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.pod["metadata"].get("annotations") or {}

    def containers(self) -> list[dict[str, Any]]:
        """Init containers first, then the others: the order of HAMi's device annotations."""
        spec = self.pod["spec"]
        return [*(spec.get("initContainers") or []), *spec["containers"]]


def examples() -> list[Example]:
    """Every pod of examples/*.yaml (what `hami up` submits by default), with the text of its document."""
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for text in re.split(r"(?m)^---\s*$", path.read_text()):
            doc = yaml.safe_load(text)
            if isinstance(doc, dict) and doc.get("kind") == "Pod":
                found.append(Example(path.name, doc, text))
    return found


@dataclass(frozen=True)
class Stack:
    env: dict[str, str]  # a fresh shell's, with TMPDIR where this stack's work directory is
    kubeconfig: str


def _stop(up: subprocess.Popen[str]) -> str:
    os.killpg(up.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it
    try:
        out, _ = up.communicate(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        os.killpg(up.pid, signal.SIGKILL)
        out, _ = up.communicate()
        pytest.fail(f"hami up did not stop within {STOP_S:.0f} s of Ctrl-C:\n{out}")
    return out


@pytest.fixture(scope="module", params=["emulated", "default"])
def stack(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`hami up` with no flag but --kube: "default" is `make run`'s (the real control plane where `make k8s`
    has built it); "emulated" is what it runs without Go. From the checkout's root, as the README says."""
    flags = ["--kube", "emulated"] if request.param == "emulated" else []
    if request.param == "default":
        binaries_or_skip()  # without the real peers the default is the emulated run above
    tmp = tmp_path_factory.mktemp(f"up-{request.param}")
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join((str(VENV_BIN), env.get("PATH", "/usr/bin:/bin")))
    env["TMPDIR"] = str(tmp)  # its work directory, where `hami status` and `hami submit` look for it
    up = subprocess.Popen(
        [HAMI, "up", *flags], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        printed = _wait_ready(up)
        assert f"{'real' if request.param == 'default' else 'emulated'} Kubernetes" in printed, printed
        (state_file,) = tmp.glob("hami-up-*/*/hami-up.json")
        yield Stack(env, read_state(state_file.parent).kubeconfig)
    finally:
        if up.poll() is None:
            out = _stop(up)
            assert "Traceback" not in out, out
            assert out.rstrip().endswith("stopped."), out


# --- every example lands as its comment says --------------------------------------------------------------


def _limit(container: Mapping[str, Any], name: str) -> int | None:
    limits = (container.get("resources") or {}).get("limits") or {}
    return int(limits[name]) if name in limits else None


def _expected_profiles(example: Example) -> list[str]:
    profiles = MIG_PROFILE.findall(example.text)
    assert profiles, f"{example.file}: {example.name} asks for MIG but its comment names no `# -> <profile>`"
    return profiles


def _check_mig(example: Example, pod: Pod, cards: Mapping[str, DeviceInfo]) -> None:
    value = pod.metadata.annotations.get(MIG_ALLOCATIONS)
    assert value, f"{example.name}: no MIG instance on {pod.spec.node_name}"
    instances = decode_mig_allocations(value)
    assert [i.profile for i in instances] == _expected_profiles(example), example.name
    assert all(cards[i.gpu_uuid].mode == MODE_MIG for i in instances), example.name


def _check_shared(example: Example, pod: Pod, cards: Mapping[str, DeviceInfo]) -> None:
    """Slices of shared cards: as many cards as asked, each holding the MiB (or share) and cores asked for."""
    assert MIG_ALLOCATIONS not in pod.metadata.annotations, f"{example.name} got a MIG instance"
    granted = decode_pod_devices(pod.metadata.annotations[DEVICES_ALLOCATED], DEVICES_ALLOCATED)
    for container, devices in zip(example.containers(), granted, strict=False):
        where = f"{example.name}/{container['name']} on {pod.spec.node_name}"
        assert len(devices) == _limit(container, GPU), where
        for device in devices:
            card = cards[device.uuid]
            assert card.mode != MODE_MIG, f"{where}: a slice of MIG card {device.uuid}"
            memory, share = _limit(container, GPU_MEMORY), _limit(container, GPU_MEMORY_PERCENTAGE)
            wanted = memory if memory is not None else card.devmem * (share or 100) // 100
            assert device.usedmem == wanted, where
            assert device.usedcores == (_limit(container, GPU_CORES) or 0), where
    if USE_GPUUUID in example.annotations:
        assert {d.uuid for c in granted for d in c} == {example.annotations[USE_GPUUUID]}, example.name
    for device in (d for c in granted for d in c):
        card_type = cards[device.uuid].type
        if USE_GPUTYPE in example.annotations:
            assert example.annotations[USE_GPUTYPE] in card_type, (example.name, card_type)
        if NOUSE_GPUTYPE in example.annotations:
            assert example.annotations[NOUSE_GPUTYPE] not in card_type, (example.name, card_type)
    if example.annotations.get(NUMA_BIND) == "true":
        assert len({cards[d.uuid].numa for c in granted for d in c}) == 1, example.name


async def _placed(kube: KubeClient, names: set[str]) -> dict[str, Pod]:
    """Every example either settled on a node (bind phase success) or still unbound."""
    pods, _ = await kube.list_pods("default")
    found = {p.metadata.name: p for p in pods if p.metadata.name in names}
    settled = all(
        not p.spec.node_name or p.metadata.annotations.get(BIND_PHASE) == BIND_PHASE_SUCCESS for p in found.values()
    )
    return found if settled and set(found) == names else {}


@pytest.mark.timeout(300)  # `hami up` starts within it: the whole default cluster on a loaded 2-core machine
async def test_every_example_lands_as_its_comment_says(stack: Stack) -> None:
    wanted = examples()
    assert {e.file for e in wanted} >= {"memory-mib.yaml", "cores.yaml", "mig.yaml", "cannot-fit.yaml"}
    async with KubeClient.from_settings(KubeSettings(kubeconfig=stack.kubeconfig)) as kube:
        pods = await eventually(lambda: _placed(kube, {e.name for e in wanted}), timeout=SETTLE_S, what="placed")
        nodes, _ = await kube.list_nodes()
        events = await kube.list_events("default", field_selector=f"reason={FAILED_SCHEDULING}")
    cards = {
        card.id: card
        for node in nodes
        if NODE_REGISTER in node.metadata.annotations
        for card in decode_node_devices(node.metadata.annotations[NODE_REGISTER])
    }
    largest = max(card.devmem for card in cards.values())
    for example in wanted:
        pod = pods[example.name]
        if any((_limit(c, GPU_MEMORY) or 0) > largest for c in example.containers()):  # cannot-fit.yaml
            assert not pod.spec.node_name, f"{example.name} asks for more than any card has, yet is on a node"
            said = [e.message for e in events if e.involved_object.name == example.name]
            assert any("CardInsufficientMemory" in message for message in said), (example.name, said)
        elif example.annotations.get(VGPU_MODE) == MODE_MIG:
            _check_mig(example, pod, cards)
        else:
            _check_shared(example, pod, cards)


# --- the README's second terminal ---------------------------------------------------------------------------


def second_terminal() -> list[DocCommand]:
    """The commands of the README's block that follows "While `make run` runs, in a second terminal"."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines, 1) if SECOND_TERMINAL in line)
    opened = next(i for i in range(start, len(lines)) if lines[i].startswith("```")) + 1  # 1-based
    closed = next(i for i in range(opened, len(lines)) if lines[i].startswith("```")) + 1
    return [c for c in commands_of(README) if opened < c.line < closed]


def test_the_readme_names_the_second_terminal_commands() -> None:
    texts = [c.text for c in second_terminal()]
    assert "./hami status" in texts
    assert "./hami submit -f examples/" in texts


@pytest.mark.timeout(300)
def test_the_readmes_second_terminal_works_beside_it(stack: Stack) -> None:
    """Each command exits 0 without a traceback; submitting examples/ again, as the README's comment says,
    reports every example as already there and changes nothing."""
    for command in second_terminal():
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command.text],
            cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{command}\nrc {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stdout + done.stderr, f"{command}\n{done.stderr}"
        if command.text == "./hami submit -f examples/":
            assert done.stdout.splitlines() == [f"pod/{e.name} unchanged (already exists)" for e in examples()]
            assert done.stderr == ""
