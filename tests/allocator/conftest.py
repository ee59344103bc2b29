"""Fixtures of the allocator tests: short socket directories, the kube emulator, a running plugin, and the
kubelet emulator; helpers to build pods the way the extender leaves them after a bind."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from hami_allocator.followup import ResultPublisher
from hami_allocator.inventory import DeclaredInventory, Gpu
from hami_allocator.server import Endpoint
from hami_allocator.service import AllocatorService
from hami_common.allocation import (
    ContainerGrant,
    GrantedDevice,
    NodeAllocationConfig,
    PodGrant,
    build_pod,
)
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    VGPU_NODE,
    ContainerDevice,
    NodeLock,
    encode_node_lock,
    encode_pod_devices,
)
from hami_common.grants import GrantKey
from hami_common.kube import KubeClient, KubeSettings, Pod
from hami_common.podresources import ListedPod
from hami_common.resources import GPU
from hami_common.staging import StagedPod, StagingStore
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.kubelet import KubeletEmulator

NODE = "gpu-node-1"
GPUS = ("GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000")
SPLIT = 4
GRANT_KEY = GrantKey(b"a key the extender and the allocators share, 32+ bytes")

Bound = Callable[..., Awaitable[Pod]]


def signature_of(uid: str, annotations: dict[str, str], key: GrantKey = GRANT_KEY) -> str:
    """What the extender writes beside a grant it made (hami_common.grants)."""
    return key.sign(uid, annotations[VGPU_NODE], annotations[DEVICES_ALLOCATED])


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory for unix sockets (their paths must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def store(tmp_path: Path) -> StagingStore:
    return StagingStore(tmp_path / "staging")


@pytest.fixture
def alloc_config(tmp_path: Path) -> NodeAllocationConfig:
    return NodeAllocationConfig(hook_path=str(tmp_path / "hook"))


@pytest.fixture
def inventory() -> DeclaredInventory:
    return DeclaredInventory(Gpu(uuid=u) for u in GPUS)


@pytest.fixture
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator(bookmark_interval=0.2) as api:
        yield api


@pytest.fixture
async def kube(emulator: KubeApiEmulator, tmp_path: Path) -> AsyncIterator[KubeClient]:
    path = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    settings = KubeSettings(kubeconfig=str(path), kube_timeout=5.0, kube_backoff_initial=0.02, kube_backoff_max=0.2)
    async with KubeClient.from_settings(settings) as connected:
        yield connected


@pytest.fixture
def core(emulator: KubeApiEmulator, tmp_path: Path) -> Iterator[Any]:
    path = emulator.write_kubeconfig(tmp_path / "kubeconfig-core")
    with config.new_client_from_config(str(path)) as api:  # type: ignore[no-untyped-call]
        yield client.CoreV1Api(api)


@asynccontextmanager
async def running_allocator(
    sockdir: Path,
    *,
    store: StagingStore,
    config: NodeAllocationConfig,
    inventory: DeclaredInventory,
    kube: KubeClient | None = None,
    publisher: ResultPublisher | None = None,
    preferred: bool = True,
    grant_key: GrantKey | None = GRANT_KEY,
    kubelet_pods: Callable[[], Awaitable[Sequence[ListedPod]]] | None = None,
) -> AsyncIterator[AllocatorService]:
    """The allocator serving on ``<sockdir>/vgpu.sock`` (re-registering within 20 ms of a kubelet restart)."""
    endpoint = Endpoint(
        plugin_dir=sockdir,
        socket_name="vgpu.sock",
        resource_name=GPU,
        preferred_available=preferred,
        register_timeout=5.0,
        watch_interval=0.02,
    )
    service = AllocatorService(
        node=NODE,
        endpoint=endpoint,
        inventory=inventory,
        store=store,
        config=config,
        split=SPLIT,
        kube=kube,
        publisher=publisher,
        grant_key=grant_key,
        kubelet_pods=kubelet_pods,
    )
    task = asyncio.create_task(service.run())
    try:
        yield service
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
async def kubelet(sockdir: Path) -> AsyncIterator[KubeletEmulator]:
    async with KubeletEmulator(sockdir, node=NODE) as emulated:
        yield emulated


def grant_of(uid: str, *containers: tuple[str, tuple[tuple[str, int, int], ...]], name: str = "") -> PodGrant:
    return PodGrant(
        pod_uid=uid,
        namespace="default",
        name=name or f"pod-{uid[:8]}",
        containers=tuple(
            ContainerGrant(name=n, devices=tuple(GrantedDevice(*d) for d in devs)) for n, devs in containers
        ),
    )


def stage(store: StagingStore, grant: PodGrant, config: NodeAllocationConfig, bind_time_ns: int) -> StagedPod:
    pod = StagedPod(
        pod_uid=grant.pod_uid,
        namespace=grant.namespace,
        name=grant.name,
        node=NODE,
        bind_time_ns=bind_time_ns,
        containers=build_pod(grant, config),
    )
    assert store.put(pod)
    return pod


def pod_object(uid: str, name: str, gpus_per_container: dict[str, int], *, namespace: str = "default") -> Pod:
    """A pod as the kubelet sees it, given directly (no apiserver)."""
    import msgspec

    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {
                "nodeName": NODE,
                "containers": [
                    {"name": c, "resources": {"limits": {GPU: str(n)}}} for c, n in gpus_per_container.items()
                ],
            },
        },
        Pod,
    )


def bound_pod_body(
    name: str,
    devices: dict[str, list[ContainerDevice]],
    *,
    bind_time: int,
    namespace: str = "default",
    extra_annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod just after the extender's bind: annotations, bind-phase allocating, nodeName set."""
    value = encode_pod_devices(list(devices.values()))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {VGPU_NODE: NODE},
            "annotations": {
                VGPU_NODE: NODE,
                BIND_TIME: str(bind_time),
                BIND_PHASE: BIND_PHASE_ALLOCATING,
                DEVICES_TO_ALLOCATE: value,
                DEVICES_ALLOCATED: value,
                **(extra_annotations or {}),
            },
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": c, "image": "cuda", "resources": {"limits": {GPU: str(len(devs))}}}
                for c, devs in devices.items()
            ],
        },
    }


def node_body(lock_holder: tuple[str, str] | None = None) -> dict[str, Any]:
    from datetime import UTC, datetime

    annotations = {}
    if lock_holder is not None:
        annotations[NODE_LOCK] = encode_node_lock(
            NodeLock(locked_at=datetime.now(UTC), namespace=lock_holder[0], name=lock_holder[1])
        )
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "annotations": annotations}}
