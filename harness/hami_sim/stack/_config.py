"""The shape of a local cluster: how many nodes, which GPUs, where its files go, how fast it reacts."""

from __future__ import annotations

import json
import os
import secrets
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hami_common.deviceconfig import DeviceConfig, parse_device_config
from hami_common.inventory import NVIDIA_VENDOR, decode_fake_inventory, default_state_file, discard_state
from hami_common.vendors.plugin import fake_vendors, plugins

__all__ = [
    "GPU_MODEL",
    "MIG_TAINT",
    "StackConfig",
    "gpu_uuid",
    "inventory_document",
    "mig_node_name",
    "node_config_document",
    "node_name",
    "vendor_capacity",
    "vendor_node_name",
]

GPU_MODEL: Final = "NVIDIA A100-SXM4-80GB"
# The taint of a MIG node when ``StackConfig.taint_mig_nodes``: deploy/'s hami-node DaemonSet tolerates the key
# (``nvidia.com/gpu``, Exists), so the node's own services still run there; a pod must tolerate the value.
MIG_TAINT: Final = {"key": "nvidia.com/gpu", "value": "mig", "effect": "NoSchedule"}
_UUID_NAMESPACE: Final = uuid.UUID("6f1d3c2a-5b9e-4c1a-9d3e-0a4b8c7d6e5f")


NODE_PLACEHOLDER: Final = "{node}"  # in a node service's kubeconfig path: one file per node


def node_name(index: int) -> str:
    return f"gpu-node-{index}"


def mig_node_name(index: int) -> str:
    return f"mig-node-{index}"


def vendor_node_name(vendor: str, index: int = 0) -> str:
    return f"{vendor}-node-{index}"


def gpu_uuid(node: str, index: int) -> str:
    """A stable, well-formed GPU UUID per (node, index), as NVML would report one."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


@dataclass(frozen=True, slots=True)
class StackConfig:
    """What ``LocalCluster`` builds. ``workdir`` holds the kubeconfig, inventory and certificates; ``sockdir``
    the unix sockets (kept short: a socket path may not exceed 107 bytes)."""

    workdir: Path
    sockdir: Path
    nodes: int = 4
    gpus_per_node: int = 8
    gpu_memory_mib: int = 81920
    gpu_model: str = GPU_MODEL
    split_count: int = 10
    retry_after: float = 1.0  # the scheduler driver's first backoff for a failing pod (doubles up to 10 s)
    stage_wait: float = 3.0  # how long a kubelet waits for the node agent's staging before it admits a pod
    metrics_port: int = 0  # 0: a free port
    node_policy: str = "binpack"
    gpu_policy: str = "spread"
    # 0: the nodes run in the stack's process (their spans reach its tracer); N: in N child processes, as
    # separate machines would, so they do not take the interpreter lock from the control plane
    node_hosts: int = 0
    # "emulated": the API emulator and a kube-scheduler stand-in; "real": etcd, kube-apiserver and
    # kube-scheduler built from their Go modules (``make k8s``), the webhook called by the apiserver
    kube: str = "emulated"
    scheduler_replicas: int = 1  # kube-scheduler + extender pairs (real only; the Lease picks the leader)
    nats_servers: int = 1  # 3: a JetStream cluster on loopback, the placement stream kept on all three
    # HAMi's device-config.yaml given to every service (--device-config-file); then its resource names and
    # per-node split counts apply, and ``split_count`` is not passed as a flag (a flag would win over the file)
    device_config_file: Path | None = None
    # Nodes beside ``nodes`` whose GPUs are cut into MIG instances (node config ``operatingmode: mig``): each
    # has ``mig_gpus_per_node`` cards of ``gpu_model`` with MIG mode on.
    mig_nodes: int = 0
    mig_gpus_per_node: int = 2
    # Whether the MIG nodes carry ``MIG_TAINT``, as an operator keeps the pods that do not ask for MIG off
    # them: `hami up` does, so that each example lands where its comment says (examples/mig.yaml tolerates
    # it). Off, pods choose between MIG and shared cards by ``nvidia.com/vgpu-mode`` alone, as in HAMi.
    taint_mig_nodes: bool = False
    # Other vendors (fake-inventory words: ascend, cambricon, hygon): one node each beside ``nodes``, holding
    # ``vendor_devices_per_node`` devices of the vendor's chart-default model, and the device-config section
    # that enables the family added to the file every service gets (``service_device_config``).
    vendors: tuple[str, ...] = ()
    vendor_devices_per_node: int = 2

    def __post_init__(self) -> None:
        known = fake_vendors()
        unknown = sorted(set(self.vendors) - set(known) - {NVIDIA_VENDOR})
        if unknown:
            raise ValueError(f"unknown vendors {unknown}; known: {', '.join([NVIDIA_VENDOR, *sorted(known)])}")

    @property
    def other_vendors(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(v for v in self.vendors if v != NVIDIA_VENDOR))

    def device_config_text(self) -> str:
        """The device config every service reads: the given file, plus each vendor's enabling section."""
        text = "" if self.device_config_file is None else self.device_config_file.read_text()
        if not self.other_vendors:
            return text
        raw = yaml.safe_load(text) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{self.device_config_file}: not a mapping")
        known = fake_vendors()
        for vendor in self.other_vendors:
            section = known[vendor]
            if section.section not in raw:  # a section the given file already has is kept as written
                raw[section.section] = dict(section.enable)
        return yaml.safe_dump(raw, sort_keys=False)

    def device_config(self) -> DeviceConfig:
        return parse_device_config(self.device_config_text())

    def node_split(self, node: str) -> int:
        if self.device_config_file is None:
            return self.split_count
        return self.device_config().for_node(node).split_count

    @property
    def gpu_resource(self) -> str:
        return self.device_config().resources.count_name

    def service_device_config(self) -> str:
        if self.other_vendors:
            return str(self.generated_device_config)
        return "" if self.device_config_file is None else str(self.device_config_file)

    @property
    def generated_device_config(self) -> Path:
        return self.workdir / "device-config.yaml"

    def node_names(self) -> tuple[str, ...]:
        return tuple(node_name(i) for i in range(self.nodes)) + self.mig_node_names() + self.vendor_node_names()

    def mig_node_names(self) -> tuple[str, ...]:
        return tuple(mig_node_name(i) for i in range(self.mig_nodes))

    def vendor_node_names(self) -> tuple[str, ...]:
        return tuple(vendor_node_name(v) for v in self.other_vendors)

    def vendor_of(self, node: str) -> str:
        """The vendor of a node's devices: NVIDIA's word unless it is a vendor node."""
        return next((v for v in self.other_vendors if vendor_node_name(v) == node), NVIDIA_VENDOR)

    def gpus_on(self, node: str) -> int:
        """NVIDIA GPUs on the node (none on a vendor node)."""
        if self.vendor_of(node) != NVIDIA_VENDOR:
            return 0
        return self.mig_gpus_per_node if node in self.mig_node_names() else self.gpus_per_node

    @property
    def node_config_file(self) -> Path | None:
        """HAMi's per-node config.json given to the node services: the MIG nodes' ``operatingmode``."""
        return self.workdir / "node-config.json" if self.mig_nodes else None

    def plugin_dir(self, node: str) -> Path:
        return self.sockdir / node

    def pod_resources_socket(self, node: str) -> Path:
        """The emulated kubelet's PodResources socket (the kubelet's <root-dir>/pod-resources/kubelet.sock)."""
        return self.sockdir / f"{node}-pod-resources" / "kubelet.sock"

    def node_dir(self, node: str) -> Path:
        return self.workdir / "nodes" / node

    @property
    def inventory_file(self) -> Path:
        return self.workdir / "inventory.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def grant_key_file(self) -> Path:
        """The key the extender signs grants with and the allocators verify them by (a Secret when deployed)."""
        return self.workdir / "grant-key"


def inventory_document(config: StackConfig) -> dict[str, Any]:
    """The fake inventory of every node: identical cards, half on each NUMA node; MIG mode on a MIG node's."""
    mig = set(config.mig_node_names())

    def card(node: str, i: int, half: int) -> dict[str, Any]:
        entry = {
            "uuid": gpu_uuid(node, i),
            "index": i,
            "model": config.gpu_model,
            "memory_mib": config.gpu_memory_mib,
            "numa": i // half,
        }
        return {**entry, "mig": True} if node in mig else entry

    known = fake_vendors()

    def device(node: str, vendor: str, i: int) -> dict[str, Any]:
        declared = known[vendor]
        return {
            "uuid": f"{vendor.upper()}-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{i}')}",
            "index": i,
            "vendor": vendor,
            "model": declared.model,
            "memory_mib": declared.memory_mib,
        }

    nodes = {}
    for node in config.node_names():
        vendor = config.vendor_of(node)
        if vendor != NVIDIA_VENDOR:
            nodes[node] = [device(node, vendor, i) for i in range(config.vendor_devices_per_node)]
            continue
        gpus = config.gpus_on(node)
        nodes[node] = [card(node, i, max(gpus // 2, 1)) for i in range(gpus)]
    return {"nodes": nodes}


def vendor_capacity(config: StackConfig, node: str) -> dict[str, str]:
    """What kubelet reports for a node's other-vendor devices: each resource their plugins serve, by count
    (Ascend's ``huawei.com/<CommonWord>`` slots, Hygon's ``hygon.com/dcunum``, Cambricon's vcore and vmemory,
    from which HAMi invents the MLUs)."""
    if config.vendor_of(node) == NVIDIA_VENDOR:
        return {}
    text = yaml.safe_dump(inventory_document(config))
    gpus, _ = decode_fake_inventory(text, node)
    found: dict[str, str] = {}
    for plugin in plugins(config.device_config().families):
        mine = [g for g in gpus if plugin.owns(g)]
        if mine:
            found.update((r, str(len(ids))) for r, ids in plugin.advertised(node, mine).items())
    return found


def node_config_document(config: StackConfig) -> dict[str, Any]:
    """HAMi's device-plugin config.json: every MIG node in ``operatingmode: mig``."""
    return {"nodeconfig": [{"name": node, "operatingmode": "mig"} for node in config.mig_node_names()]}


def write_grant_key(config: StackConfig) -> Path:
    """A fresh random key for this run, readable by its owner only."""
    path = config.grant_key_file
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    tmp.replace(path)
    return path


def write_inventory(config: StackConfig) -> Path:
    """The fake inventory, and the node config when there are MIG nodes, whose fake driver starts with no
    instances (a fresh machine: a stale state file would hold instances no scheduler knows of)."""
    if config.node_config_file is not None:
        _write(config.node_config_file, json.dumps(node_config_document(config), indent=2))
    if config.other_vendors:
        _write(config.generated_device_config, config.device_config_text())
    for node in config.mig_node_names():
        discard_state(default_state_file(config.inventory_file, node))
    return _write(config.inventory_file, yaml.safe_dump(inventory_document(config), sort_keys=False))


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
