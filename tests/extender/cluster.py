"""Seeding the Kubernetes API emulator with GPU nodes and pods, as the node agent and users would."""

from __future__ import annotations

from typing import Any

from hami_common.annotations import NODE_REGISTER, DeviceInfo, encode_node_devices
from hami_common.resources import GPU
from hami_sim.kubeapi import KubeApiEmulator, ResourceType, find_resource


def _resource(plural: str) -> ResourceType:
    found = find_resource("", "v1", plural)
    assert found is not None
    return found


PODS = _resource("pods")
NODES = _resource("nodes")
NAMESPACES = _resource("namespaces")
QUOTAS = _resource("resourcequotas")
EVENTS = _resource("events")


def cards(node: str, n: int = 2, devmem: int = 8000, count: int = 10) -> list[DeviceInfo]:
    return [
        DeviceInfo(
            id=f"GPU-{node}-{i}",
            index=i,
            count=count,
            devmem=devmem,
            devcore=100,
            type="NVIDIA-A100",
            mode="hami-core",
            health=True,
        )
        for i in range(n)
    ]


def add_node(
    api: KubeApiEmulator,
    name: str,
    devices: list[DeviceInfo] | None = None,
    *,
    allocatable: int | None = None,
    annotations: dict[str, str] | None = None,
) -> None:
    """A registered GPU node; its kubelet reports ``allocatable`` GPUs (default: every slot of every card)."""
    devices = devices if devices is not None else cards(name)
    anns = {NODE_REGISTER: encode_node_devices(devices), **(annotations or {})}
    gpus = sum(d.count for d in devices) if allocatable is None else allocatable
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": anns},
        "status": {"capacity": {GPU: str(gpus)}, "allocatable": {GPU: str(gpus)}},
    }
    api.store.create(NODES, None, body)


def set_allocatable(api: KubeApiEmulator, name: str, gpus: int) -> None:
    """The kubelet reports a new GPU count, e.g. 0 when the device plugin went away."""

    def mutate(node: dict[str, Any]) -> dict[str, Any]:
        node.setdefault("status", {})["allocatable"] = {GPU: str(gpus)}
        return node

    api.store.update(NODES, None, name, mutate, subresource="status")


def node_annotations(api: KubeApiEmulator, name: str) -> dict[str, str]:
    anns: dict[str, str] = api.store.get(NODES, None, name)["metadata"].get("annotations") or {}
    return anns


def ensure_namespace(api: KubeApiEmulator, namespace: str) -> None:
    try:
        api.store.get(NAMESPACES, None, namespace)
    except Exception:  # the emulator's NotFound
        api.store.create(NAMESPACES, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})


def gpu_container(
    name: str = "main", gpus: int = 1, mem: int | None = 1000, cores: int | None = None
) -> dict[str, Any]:
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    return {"name": name, "image": "cuda", "resources": {"limits": limits}}


def add_pod(
    api: KubeApiEmulator,
    name: str,
    *,
    namespace: str = "default",
    containers: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    ensure_namespace(api, namespace)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": annotations or {}}
    if labels:
        metadata["labels"] = labels
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"schedulerName": "hami-scheduler", "containers": containers or [gpu_container()]},
    }
    created: dict[str, Any] = api.store.create(PODS, namespace, body)
    return created


def pod_annotations(api: KubeApiEmulator, name: str, namespace: str = "default") -> dict[str, str]:
    anns: dict[str, str] = api.store.get(PODS, namespace, name)["metadata"].get("annotations") or {}
    return anns
