"""Fixtures of the kube tests: a fresh API emulator per test, and clients connected to it through the
kubeconfig it writes (the official client, our KubeClient, and kubectl)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from hami_common.kube import KubeClient, KubeSettings
from hami_sim.kubeapi import KubeApiEmulator


@pytest.fixture
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator(bookmark_interval=0.2) as api:
        yield api


@pytest.fixture
def kubeconfig(emulator: KubeApiEmulator, tmp_path: Path) -> Path:
    return emulator.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def api_client(kubeconfig: Path) -> Iterator[Any]:
    """The official client, configured from the kubeconfig only."""
    with config.new_client_from_config(str(kubeconfig)) as api:  # type: ignore[no-untyped-call]
        yield api


@pytest.fixture
def core(api_client: Any) -> Any:
    return client.CoreV1Api(api_client)


@pytest.fixture
def kube_settings(kubeconfig: Path) -> KubeSettings:
    return KubeSettings(
        kubeconfig=str(kubeconfig),
        kube_timeout=5.0,
        kube_watch_seconds=30,
        kube_backoff_initial=0.02,
        kube_backoff_max=0.2,
    )


@pytest.fixture
async def kube(kube_settings: KubeSettings) -> AsyncIterator[KubeClient]:
    async with KubeClient.from_settings(kube_settings) as connected:
        yield connected


def pod_body(name: str, *, namespace: str = "default", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


def node_body(name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}
