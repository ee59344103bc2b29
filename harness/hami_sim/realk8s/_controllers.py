"""kube-controller-manager with only the controllers a test needs, against a :class:`ControlPlane`.

Most tests of the real tier run without it (the plane disables the admission plugins that need it, see
``_plane``); the DRA tests need the resourceclaim controller, which makes each pod's ResourceClaim from its
template, and the garbage collector, which deletes the claim with its pod (the claim's owner). The binary is
optional (``make k8s`` builds it; an older build folder lacks it): :func:`find_controller_manager` says so.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from hami_sim.realk8s._binaries import BinariesMissing, K8sBinaries
from hami_sim.realk8s._peer import Peer

__all__ = ["CONTROLLER_MANAGER", "DRA_CONTROLLERS", "KubeControllerManager", "find_controller_manager"]

CONTROLLER_MANAGER: Final = "kube-controller-manager"
# kube-controller-manager's own names (cmd/kube-controller-manager/names): claims from templates, and their
# deletion with the pod that owns them
DRA_CONTROLLERS: Final = ("resourceclaim-controller", "garbage-collector-controller")


def find_controller_manager(binaries: K8sBinaries) -> str:
    """The kube-controller-manager beside the other peers; BinariesMissing (how to build it) if absent."""
    path = binaries[CONTROLLER_MANAGER]
    if not os.access(path, os.X_OK):
        raise BinariesMissing(f"{CONTROLLER_MANAGER} not built in {binaries.folder} (run `make k8s`)")
    return path


class KubeControllerManager(Peer):
    """One kube-controller-manager running ``controllers`` only, as the plane's admin, serving no port.

    No leader election (one instance per test plane) and no service-account credentials per controller:
    the admin kubeconfig authorises every controller, which is what a test of their effect needs."""

    def __init__(
        self,
        binaries: K8sBinaries,
        folder: Path,
        kubeconfig: Path,
        controllers: Sequence[str] = DRA_CONTROLLERS,
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        argv = [
            find_controller_manager(binaries),
            f"--kubeconfig={kubeconfig}",
            f"--controllers={','.join(controllers)}",
            "--leader-elect=false",
            "--secure-port=0",
            "--use-service-account-credentials=false",
            "--v=1",
        ]
        super().__init__(CONTROLLER_MANAGER, argv, folder / f"{CONTROLLER_MANAGER}.log", restart=True)
