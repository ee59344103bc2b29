"""The real kubelet on a fake container runtime: its own device manager calls our device plugin.

``RealKubelet`` runs ``fakecri`` (tools/k8s/fakecri: the in-memory CRI runtime of k8s.io/cri-client, which
also prints every CreateContainer request's envs, mounts and devices) and the kubelet v1.37 built beside
kube-apiserver, authenticated as ``system:node:<name>`` in group ``system:nodes`` (the Node authorizer's
rules apply to it). The kubelet runs in a private mount namespace (``unshare --mount``) where:

* a per-node folder is bind-mounted over ``/var/lib/kubelet/device-plugins``, the socket directory the
  kubelet hard-codes, so our allocator registers through the host path ``plugin_dir`` and several kubelets
  may run on one machine;
* the sysctls the kubelet writes at start (vm.overcommit_memory, kernel.panic, ...) are copies, so the host
  keeps its own values.

No cgroups are made (``cgroupsPerQOS: false``), no CNI is needed (the fake runtime reports its network ready).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Final

import yaml

from hami_sim.realk8s._peer import Peer, unshare_works
from hami_sim.realk8s._plane import ControlPlane, free_port

__all__ = ["DEVICE_PLUGIN_DIR", "RealKubelet", "mount_namespaces_work"]

DEVICE_PLUGIN_DIR: Final = Path("/var/lib/kubelet/device-plugins")
# what the kubelet sets at start with protectKernelDefaults: false
_SYSCTLS: Final = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
Json = dict[str, Any]


def mount_namespaces_work() -> bool:
    """Whether this process may make a private mount namespace and bind-mount in it (root, unshare)."""
    return unshare_works("--mount", "--propagation", "private", "sh", "-c", "mount --bind / /mnt")


class RealKubelet:
    def __init__(self, plane: ControlPlane, node: str, folder: Path) -> None:
        self.node = node
        self.folder = folder
        self.plugin_dir = folder / "device-plugins"
        for sub in (self.plugin_dir, folder / "root", folder / "pki", folder / "pod-logs", folder / "sysctl"):
            sub.mkdir(parents=True, exist_ok=True)
        credentials = plane.ca.client(f"kubelet-{node}", f"system:node:{node}", ("system:nodes",))
        kubeconfig = plane.write_kubeconfig(folder / "kubeconfig", credentials=credentials)
        socket = f"unix://{folder / 'cri.sock'}"
        config_file = folder / "kubelet.yaml"
        config_file.write_text(yaml.safe_dump(self._configuration(socket), sort_keys=False))
        binaries = plane.binaries
        self.runtime = Peer("fakecri", [binaries["fakecri"], f"--listen={socket}"], folder / "fakecri.log")
        kubelet = [
            binaries["kubelet"], f"--config={config_file}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={node}", f"--root-dir={folder / 'root'}", f"--cert-dir={folder / 'pki'}", "--v=1",
        ]  # fmt: skip
        binds = [*self._sysctl_binds(), f"mount --bind {shlex.quote(str(self.plugin_dir))} {DEVICE_PLUGIN_DIR}"]
        script = " && ".join([*binds, f"exec {shlex.join(kubelet)}"])
        self.kubelet = Peer(
            "kubelet", ["unshare", "--mount", "--propagation", "private", "sh", "-c", script], folder / "kubelet.log"
        )

    def _configuration(self, socket: str) -> Json:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": socket,
            "imageServiceEndpoint": socket,
            "address": "127.0.0.1",
            "port": free_port(),
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "readOnlyPort": 0,
            "podLogsDir": str(self.folder / "pod-logs"),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],  # must be empty without QoS cgroups
            "failCgroupV1": False,  # these machines mount cgroup v1 controllers
            "failSwapOn": False,
            "localStorageCapacityIsolation": False,
            "evictionHard": {},
            "imageGCHighThresholdPercent": 100,
            "protectKernelDefaults": False,
            "registerNode": True,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
        }

    def _sysctl_binds(self) -> list[str]:
        binds = []
        for key in _SYSCTLS:
            real = Path("/proc/sys") / key
            if not real.exists():
                continue
            copy = self.folder / "sysctl" / key.replace("/", "_")
            copy.write_text(real.read_text())
            binds.append(f"mount --bind {shlex.quote(str(copy))} {real}")
        return binds

    @property
    def pod_resources_socket(self) -> Path:
        """The kubelet's PodResources socket (``<root-dir>/pod-resources/kubelet.sock``)."""
        return self.folder / "root" / "pod-resources" / "kubelet.sock"

    def start(self) -> None:
        DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)  # the bind mount's target
        self.runtime.start()
        self.kubelet.start()

    def stop(self) -> None:
        self.kubelet.stop()
        self.runtime.stop()

    def created_containers(self) -> list[Json]:
        """Every CreateContainer request the runtime got: envs, mounts, devices as the kubelet passed them."""
        found = []
        for line in self.runtime.log_file.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                record: Json = json.loads(line)
                if record.get("event") == "CreateContainer":
                    found.append(record)
        return found
