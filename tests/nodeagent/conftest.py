"""Fixtures of the node agent tests: a declared fake inventory, the kube emulator, a node object."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_common.kube import KubeClient, KubeSettings
from hami_sim.kubeapi import KubeApiEmulator

NODE = "gpu-node-1"
UUID_A = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"
UUID_B = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"


def inventory_doc(*, healthy_b: bool = True) -> dict[str, Any]:
    return {
        "nodes": {
            NODE: [
                {
                    "uuid": UUID_A, "model": "Tesla V100-PCIE-32GB", "memory_mib": 32768, "numa": 0,
                    "links": [{"peer": UUID_B, "nvlinks": 2, "pcie": "same-cpu"}], "used_mib": 2048,
                    "utilization": 40, "memory_utilization": 12,
                },
                {
                    "uuid": UUID_B, "index": 1, "model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "numa": 1,
                    "healthy": healthy_b, "links": [{"peer": UUID_A, "nvlinks": 2, "pcie": "same-cpu"}],
                },
            ],
            "cpu-node": [],
        }
    }  # fmt: skip


def write_inventory(path: Path, doc: dict[str, Any]) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.replace(path)
    return path


@pytest.fixture
def inventory_file(tmp_path: Path) -> Path:
    return write_inventory(tmp_path / "inventory.yaml", inventory_doc())


@pytest.fixture
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator(bookmark_interval=0.2) as api:
        yield api


@pytest.fixture
def kube_settings(emulator: KubeApiEmulator, tmp_path: Path) -> KubeSettings:
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    return KubeSettings(
        kubeconfig=str(kubeconfig), kube_timeout=5.0, kube_watch_seconds=30, kube_backoff_initial=0.02,
        kube_backoff_max=0.2,
    )  # fmt: skip


@pytest.fixture
async def kube(kube_settings: KubeSettings) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_settings(kube_settings) as connected:
        yield connected


@pytest.fixture
async def node(kube: KubeClient) -> str:
    """This test's GPU node, created through the official client."""
    core: Any = kube.core  # the official client, untyped here: bodies are plain JSON
    await asyncio.to_thread(core.create_node, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    return NODE


async def create_pod(kube: KubeClient, name: str, *, containers: tuple[str, ...] = ("main",)) -> str:
    """A pod already bound to this test's node; returns its UID."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": NODE, "containers": [{"name": c, "image": "cuda"} for c in containers]},
    }
    core: Any = kube.core
    created = await asyncio.to_thread(core.create_namespaced_pod, "default", body)
    return str(created.metadata.uid)


async def delete_pod(kube: KubeClient, name: str) -> None:
    await asyncio.to_thread(kube.core.delete_namespaced_pod, name, "default")
