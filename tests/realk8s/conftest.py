"""The real-Kubernetes tier: etcd, kube-apiserver, kube-scheduler and kubectl built by ``make k8s``.

Without the binaries every test here skips with the reason; under ``CI=true`` that is a failure, so CI
never passes without having run this tier.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from hami_sim.realk8s import BinariesMissing, ControlPlane, K8sBinaries, find_binaries, find_controller_manager
from hami_sim.stack import LocalCluster, StackConfig


def binaries_or_skip() -> K8sBinaries:
    try:
        return find_binaries()
    except BinariesMissing as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the real-Kubernetes tier must run under CI: {err}", pytrace=False)
        pytest.skip(f"real Kubernetes peers not built: {err}")


def controller_manager_or_skip(binaries: K8sBinaries) -> str:
    """kube-controller-manager, which only some tests run: missing, those skip (fail under ``CI=true``)."""
    try:
        return find_controller_manager(binaries)
    except BinariesMissing as err:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the real-Kubernetes tier must run under CI: {err}", pytrace=False)
        pytest.skip(f"real Kubernetes peers not built: {err}")


@pytest.fixture(scope="session")
def k8s() -> K8sBinaries:
    return binaries_or_skip()


@pytest.fixture(scope="session")
def plane(k8s: K8sBinaries) -> Iterator[ControlPlane]:
    """One etcd + kube-apiserver shared by the tests that only talk to the API."""
    with ControlPlane(binaries=k8s) as running:
        yield running


@pytest.fixture
def sockdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hami-k8s-") as folder:
        yield Path(folder)


def real_config(
    tmp_path: Path, sockdir: Path, *, nodes: int = 4, replicas: int = 1, node_hosts: int = 1
) -> StackConfig:
    return StackConfig(
        workdir=tmp_path / "stack",
        sockdir=sockdir,
        nodes=nodes,
        gpus_per_node=8,
        node_policy="spread",
        node_hosts=node_hosts,
        kube="real",
        scheduler_replicas=replicas,
    )


@pytest.fixture
async def real_cluster(k8s: K8sBinaries, tmp_path: Path, sockdir: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(real_config(tmp_path, sockdir)) as running:
        yield running


def kubectl(binaries: K8sBinaries, cluster: LocalCluster, *args: str, check: bool = True) -> str:
    """The real kubectl against the stack's kube-apiserver; stdout, or stderr when ``check`` is off and it
    failed (what a user reads on the terminal)."""
    done = subprocess.run(
        [binaries["kubectl"], "--kubeconfig", str(cluster.config.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert done.returncode == 0, done.stderr
    return done.stdout if done.returncode == 0 else done.stderr


async def failed_scheduling(cluster: LocalCluster, namespace: str, uid: str) -> str:
    """kube-scheduler's FailedScheduling message for one pod ('' until it has written one)."""
    events = await cluster.kube.list_events(namespace, field_selector="reason=FailedScheduling")
    return next((e.message for e in events if e.involved_object.uid == uid), "")
