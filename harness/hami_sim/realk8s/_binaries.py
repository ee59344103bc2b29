"""Where the real Kubernetes peers are: binaries built by ``make k8s`` (tools/k8s/build.sh) from pinned Go modules."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["BIN_ENV", "PEERS", "BinariesMissing", "K8sBinaries", "default_folder", "find_binaries", "repo_root"]

BIN_ENV: Final = "HAMI_K8S_BIN"  # a folder holding the binaries; default .cache/k8s/bin in the checkout
PEERS: Final = ("etcd", "kube-apiserver", "kube-scheduler", "kubectl", "kubelet", "fakecri")


class BinariesMissing(RuntimeError):
    """The real peers are not built here; the message says what is missing and how to build it."""


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def default_folder() -> Path:
    configured = os.environ.get(BIN_ENV, "")
    return Path(configured) if configured else repo_root() / ".cache" / "k8s" / "bin"


@dataclass(frozen=True, slots=True)
class K8sBinaries:
    folder: Path

    def __getitem__(self, name: str) -> str:
        return str(self.folder / name)

    @property
    def version(self) -> str:
        stamp = self.folder / "VERSION"
        return stamp.read_text().strip() if stamp.exists() else "unknown"


def find_binaries(folder: Path | None = None) -> K8sBinaries:
    where = folder or default_folder()
    missing = [name for name in PEERS if not os.access(where / name, os.X_OK)]
    if missing:
        how = "run `make k8s`" if shutil.which("go") else "install Go >= 1.26, then run `make k8s`"
        raise BinariesMissing(f"{', '.join(missing)} not built in {where} ({how})")
    return K8sBinaries(where)
