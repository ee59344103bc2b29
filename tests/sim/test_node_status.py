"""The simulated kubelet reports the phase of each pod it admitted, as the real one's status manager does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hami_common.kube import KubeClient, KubeSettings
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.kubelet import ContainerAdmission, PodAdmission
from hami_sim.stack import SimNode, StackConfig
from hami_sim.stack._node import ADMISSION_ERROR, NodeConnections


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[KubeClient]:
    with KubeApiEmulator() as api:
        path = api.write_kubeconfig(tmp_path / "kubeconfig")
        async with KubeClient.from_settings(KubeSettings(kubeconfig=str(path))) as client:
            yield client


async def _node(kube: KubeClient, tmp_path: Path, tasks: asyncio.TaskGroup) -> SimNode:
    config = StackConfig(workdir=tmp_path, sockdir=tmp_path)
    return SimNode("gpu-node-0", config, NodeConnections("nats://unused", "unused"), tasks, lambda _: None, kube)


async def test_admitted_pods_run_and_a_failed_allocate_fails_the_pod(kube: KubeClient, tmp_path: Path) -> None:
    for name in ("ok", "refused"):
        body: Any = {"metadata": {"name": name}, "spec": {"containers": [{"name": "cuda", "image": "cuda"}]}}
        await asyncio.to_thread(kube.core.create_namespaced_pod, "default", body)
    ok, refused = (await kube.get_pod("default", "ok")), (await kube.get_pod("default", "refused"))
    async with asyncio.TaskGroup() as tasks:
        node = await _node(kube, tmp_path, tasks)
        await node._report(
            kube, ok, PodAdmission(ok.metadata.uid, "default", "ok", (ContainerAdmission("cuda", ("d",)),))
        )
        failed = (ContainerAdmission("cuda", (), None, "unknown device d"),)
        await node._report(kube, refused, PodAdmission(refused.metadata.uid, "default", "refused", failed))
    running = await kube.get_pod("default", "ok")
    assert running.status.phase == "Running"
    assert [(c.type, c.status) for c in running.status.conditions] == [("Ready", "True")]
    gone = await kube.get_pod("default", "refused")
    assert (gone.status.phase, gone.status.reason) == ("Failed", ADMISSION_ERROR)
    assert "cuda: unknown device d" in gone.status.message


async def test_a_pod_deleted_meanwhile_is_logged_not_raised(kube: KubeClient, tmp_path: Path) -> None:
    body: Any = {"metadata": {"name": "brief"}, "spec": {"containers": [{"name": "cuda", "image": "cuda"}]}}
    await asyncio.to_thread(kube.core.create_namespaced_pod, "default", body)
    pod = await kube.get_pod("default", "brief")
    await asyncio.to_thread(kube.core.delete_namespaced_pod, "brief", "default")
    async with asyncio.TaskGroup() as tasks:
        node = await _node(kube, tmp_path, tasks)
        await node._report(kube, pod, PodAdmission(pod.metadata.uid, "default", "brief", ()))
