"""The shape of a local cluster: how many nodes, which GPUs, where its files go, how fast it reacts."""

from __future__ import annotations

import os
import secrets
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from hami_common.deviceconfig import DeviceConfig, read_device_config

__all__ = ["GPU_MODEL", "StackConfig", "gpu_uuid", "inventory_document", "node_name"]

GPU_MODEL: Final = "NVIDIA A100-SXM4-80GB"
_UUID_NAMESPACE: Final = uuid.UUID("6f1d3c2a-5b9e-4c1a-9d3e-0a4b8c7d6e5f")


NODE_PLACEHOLDER: Final = "{node}"  # in a node service's kubeconfig path: one file per node


def node_name(index: int) -> str:
    return f"gpu-node-{index}"


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

    def device_config(self) -> DeviceConfig:
        return DeviceConfig() if self.device_config_file is None else read_device_config(self.device_config_file)

    def node_split(self, node: str) -> int:
        if self.device_config_file is None:
            return self.split_count
        return self.device_config().for_node(node).split_count

    @property
    def gpu_resource(self) -> str:
        return self.device_config().resources.count_name

    def service_device_config(self) -> str:
        return "" if self.device_config_file is None else str(self.device_config_file)

    def node_names(self) -> tuple[str, ...]:
        return tuple(node_name(i) for i in range(self.nodes))

    def plugin_dir(self, node: str) -> Path:
        return self.sockdir / node

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
    """The fake inventory of every node: ``gpus_per_node`` identical cards, half on each NUMA node."""
    half = max(config.gpus_per_node // 2, 1)
    return {
        "nodes": {
            node: [
                {
                    "uuid": gpu_uuid(node, i),
                    "index": i,
                    "model": config.gpu_model,
                    "memory_mib": config.gpu_memory_mib,
                    "numa": i // half,
                }
                for i in range(config.gpus_per_node)
            ]
            for node in config.node_names()
        }
    }


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
    path = config.inventory_file
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(inventory_document(config), sort_keys=False))
    tmp.replace(path)
    return path
