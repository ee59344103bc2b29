"""kube-scheduler named ``hami-scheduler``, configured as ``deploy/`` configures it, with our extender.

Each replica runs with the deployed KubeSchedulerConfiguration (leader election on, the extender's verbs,
``nodeCacheCapable``, ``managedResources``, TLS verified against the stack's CA), restarted whenever it
exits (kube-scheduler exits 1 when it loses its Lease, as a kubelet would restart the container). Given a
``hostname``, the replica runs in a UTS namespace of its own with that host name: kube-scheduler's Lease
identity is ``<hostname>_<uuid>``, and HAMi's extender (ours too, in ``follow`` mode) leads when the holder
starts with its own host name, so two replica pairs on one machine must not share one.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import yaml

from hami_sim.realk8s._binaries import K8sBinaries
from hami_sim.realk8s._peer import Peer, unshare_works

__all__ = ["KubeScheduler", "uts_namespaces_work"]

Json = dict[str, Any]


def uts_namespaces_work() -> bool:
    return unshare_works("--uts", "--", "hostname", "hami-probe")


class KubeScheduler(Peer):
    def __init__(
        self, binaries: K8sBinaries, folder: Path, config: Json, *, name: str = "kube-scheduler", hostname: str = ""
    ) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        config_file = folder / f"{name}.yaml"
        config_file.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [binaries["kube-scheduler"], f"--config={config_file}", "--secure-port=0", "--v=1"]
        if hostname:
            command = f"hostname {shlex.quote(hostname)} && exec {shlex.join(argv)}"
            argv = ["unshare", "--uts", "--", "sh", "-c", command]
        super().__init__(name, argv, folder / f"{name}.log", restart=True)
        self.hostname = hostname
