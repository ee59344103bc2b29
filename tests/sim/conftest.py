"""Fixtures of the simulator tests: the API emulator, and clients of it."""

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
def core(emulator: KubeApiEmulator, tmp_path: Path) -> Iterator[Any]:
    path = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    with config.new_client_from_config(str(path)) as api:  # type: ignore[no-untyped-call]
        yield client.CoreV1Api(api)


@pytest.fixture
async def kube(emulator: KubeApiEmulator, tmp_path: Path) -> AsyncIterator[KubeClient]:
    settings = KubeSettings(
        kubeconfig=str(emulator.write_kubeconfig(tmp_path / "kc")), kube_backoff_initial=0.02, kube_backoff_max=0.2
    )
    async with KubeClient.from_settings(settings) as connected:
        yield connected
