"""One simulated GPU node: the node agent and the allocator of this checkout, and a kubelet emulator.

The node agent reads the stack's fake inventory, registers the node and pre-stages placements; the
allocator serves the device plugin API on a real unix socket; the kubelet emulator registers it, follows
ListAndWatch and admits the pods bound here (the stack's one pod watch hands them over), calling
``Allocate`` exactly as the kubelet's device manager does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from hami_allocator.service import serve as serve_allocator
from hami_allocator.settings import AllocatorSettings
from hami_common.errors import HamiError
from hami_common.inventory import FAKE
from hami_common.kube import (
    Change,
    ContainerState,
    ContainerStateRunning,
    ContainerStatus,
    KubeClient,
    Pod,
    PodCondition,
    PodStatus,
)
from hami_common.staging import StagingStore
from hami_common.tracing import service_scope
from hami_nodeagent.agent import serve as serve_agent
from hami_nodeagent.settings import NodeAgentSettings
from hami_sim.deployed import deployed_settings
from hami_sim.kubelet import KubeletEmulator, PodAdmission
from hami_sim.stack._config import NODE_PLACEHOLDER, StackConfig, vendor_capacity
from hami_sim.stack._service import FailureHook, ProcessService, RunningService
from hami_sim.waiting import ConditionTimeoutError, eventually

__all__ = ["Admitted", "LaunchedNode", "NodeConnections", "SimNode", "hand_over"]

log = logging.getLogger(__name__)

ADMISSION_ERROR: Final = "UnexpectedAdmissionError"  # the kubelet's reason for a pod whose Allocate failed


@dataclass(frozen=True, slots=True)
class NodeConnections:
    """Where a node's services find NATS and the apiserver, and where the emulated kubelets do: a real
    kubelet acts as ``system:node:<name>``; the emulated ones, many nodes in one process, as the stack's
    admin (empty: the services' own kubeconfig)."""

    nats_url: str
    kubeconfig: str
    kubelet_kubeconfig: str = ""

    @property
    def kubelet(self) -> str:
        return self.kubelet_kubeconfig or self.kubeconfig

    def kubeconfig_for(self, node: str) -> str:
        """The node services' kubeconfig on ``node``: per node where the path holds ``{node}``."""
        return self.kubeconfig.replace(NODE_PLACEHOLDER, node)


@dataclass(frozen=True, slots=True)
class LaunchedNode:
    """A node whose node agent and allocator are the launched pod of deploy/'s DaemonSet: the kubelet's
    device-plugin folder and the staging folder are that pod's hostPath volumes."""

    plugin_dir: Path
    staging_dir: Path
    pod_resources: Path  # the allocator's HAMI_POD_RESOURCES_SOCKET, where this node's kubelet serves List
    agent: ProcessService
    allocator: ProcessService


@dataclass(frozen=True, slots=True)
class Admitted:
    """A pod the kubelet admitted: what every Allocate answered, and when (``time.monotonic()``)."""

    node: str
    admission: PodAdmission
    at: float


class SimNode:
    def __init__(
        self,
        name: str,
        config: StackConfig,
        connections: NodeConnections,
        tasks: asyncio.TaskGroup,
        on_admitted: Callable[[Admitted], None],
        kube: KubeClient | None = None,
        on_failure: FailureHook | None = None,
        launched: LaunchedNode | None = None,
    ) -> None:
        self.name = name
        self._kube = kube  # where the kubelet reports the phase of the pods it admitted
        self._finishing: set[asyncio.Task[None]] = set()
        self._terminated: set[str] = set()  # pods whose deletion this kubelet has finished (or is finishing)
        self.config = config
        self.connections = connections
        self.launched = launched
        self.kubelet = KubeletEmulator(
            launched.plugin_dir if launched else config.plugin_dir(name),
            node=name,
            pod_resources=launched.pod_resources if launched else config.pod_resources_socket(name),
        )
        self.agent: RunningService | ProcessService = (
            launched.agent if launched else RunningService(f"nodeagent/{name}", self._run_agent, tasks, on_failure)
        )
        self.allocator: RunningService | ProcessService = (
            launched.allocator
            if launched
            else RunningService(f"allocator/{name}", self._run_allocator, tasks, on_failure)
        )
        self.admitter = RunningService(f"kubelet/{name}", self._run_admissions, tasks, on_failure)
        self._on_admitted = on_admitted
        self._queue: asyncio.Queue[Pod] = asyncio.Queue()
        self._seen: set[str] = set()
        self._store = StagingStore(launched.staging_dir if launched else config.node_dir(name) / "staging")
        self._resource = config.gpu_resource  # the device config's resourceCountName, read once
        self._vendor_resources = vendor_capacity(config, name)  # other vendors' plugins on this node
        self._reports: set[asyncio.Task[None]] = set()

    @property
    def devices(self) -> int:
        """Virtual devices the allocator advertises: GPUs × split count."""
        return self.config.gpus_on(self.name) * self.config.node_split(self.name)

    # deploy/'s hami-node DaemonSet (hami_sim.deployed.deployed_settings), with this node's places mapped
    def agent_settings(self) -> NodeAgentSettings:
        node_dir = self.config.node_dir(self.name)
        return deployed_settings(
            NodeAgentSettings,
            "hami-node",
            "nodeagent",
            mapped={
                **self._node_places(),
                "staging_dir": str(node_dir / "staging"),
                "hook_path": str(node_dir / "hook"),
                "placement_ack_wait": 5.0,
            },
        )

    def allocator_settings(self) -> AllocatorSettings:
        node_dir = self.config.node_dir(self.name)
        return deployed_settings(
            AllocatorSettings,
            "hami-node",
            "allocator",
            mapped={
                **self._node_places(),
                "plugin_dir": str(self.config.plugin_dir(self.name)),
                "pod_resources_socket": str(self.config.pod_resources_socket(self.name)),
                "staging_dir": str(node_dir / "staging"),
                "hook_path": str(node_dir / "hook"),
                "grant_key_file": str(self.config.grant_key_file),
                "vendor_host_root": str(node_dir / "host"),
                "numa_topology": True,
            },
        )

    def _node_places(self) -> dict[str, object]:
        """What both containers of the node pod are given here: the node, its connections, its fake GPUs."""
        return {
            "nats_url": self.connections.nats_url,
            "kubeconfig": self.connections.kubeconfig_for(self.name),
            "kube_backoff_initial": 0.05,
            "kube_backoff_max": 1.0,
            "node_name": self.name,
            "inventory": FAKE,  # deploy/'s nvml, as the launcher maps it
            "fake_inventory": str(self.config.inventory_file),
            "device_split_count": None if self.config.device_config_file else self.config.split_count,
            "device_config_file": self.config.service_device_config(),
            "node_config_file": str(self.config.node_config_file or ""),
        }

    # service.name per kind of service, the node as its instance (one process may hold many nodes)
    async def _run_agent(self, stop: asyncio.Event) -> None:
        with service_scope("hami-nodeagent", self.name):
            await serve_agent(self.agent_settings(), stop)

    async def _run_allocator(self, stop: asyncio.Event) -> None:
        with service_scope("hami-allocator", self.name):
            await serve_allocator(self.allocator_settings(), stop)

    async def _until_staged(self, uid: str) -> None:
        """Give the node agent up to ``stage_wait`` seconds to stage the pod before the kubelet asks.

        A real kubelet spends at least that long between seeing a pod bound and admitting it; without the
        pause the emulator asks within microseconds, the allocator serves the pod from its annotations, and a
        placement staged a moment later is served again to the next pod on this node (reported upstream).
        """
        store = self._store
        try:
            await eventually(lambda: uid in store.staged_uids(), timeout=self.config.stage_wait, what="staged")
        except ConditionTimeoutError:
            log.info("pod %s not staged within %.1fs; the allocator falls back", uid, self.config.stage_wait)

    async def _run_admissions(self, stop: asyncio.Event) -> None:
        async def admit_forever() -> None:
            while True:
                pod = await self._queue.get()
                if _asks_for_gpus(pod, self._resource):  # a pod without devices has nothing to stage: it starts at once
                    await self._until_staged(pod.metadata.uid)
                admission = await self.kubelet.admit(pod)
                self._on_admitted(Admitted(self.name, admission, time.monotonic()))
                if self._kube is not None:  # the kubelet's status manager writes apart from admission
                    task = asyncio.create_task(self._report(self._kube, pod, admission))
                    self._reports.add(task)
                    task.add_done_callback(self._reports.discard)

        async with asyncio.TaskGroup() as tg:
            admitting = tg.create_task(admit_forever(), name=f"admit:{self.name}")
            await stop.wait()
            admitting.cancel()

    async def _report(self, kube: KubeClient, pod: Pod, admission: PodAdmission) -> None:
        """Running once every container got its devices; Failed with the kubelet's reason when one did not."""
        if admission.ok:  # every container started and ready, so kubectl reads READY n/n as on a real node
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            running = ContainerState(running=ContainerStateRunning(started_at=now))
            containers = tuple(
                ContainerStatus(name=c.name, image=c.image, started=True, ready=True, state=running)
                for c in pod.spec.containers
            )
            status = PodStatus(
                phase="Running",
                conditions=(PodCondition(type="Ready", status="True"),),
                container_statuses=containers,
            )
        else:
            failed = "; ".join(f"{c.name}: {c.error}" for c in admission.containers if c.error)
            status = PodStatus(
                phase="Failed", reason=ADMISSION_ERROR, message=f"Allocate failed due to {failed}, which is unexpected"
            )
        try:
            await kube.patch_pod_status(pod.metadata.namespace, pod.metadata.name, status)
        except HamiError as err:
            log.warning("status of pod %s/%s not reported: %s", pod.metadata.namespace, pod.metadata.name, err)

    async def start(self) -> None:
        """Kubelet first (a plugin registers with it), then the node agent and the allocator."""
        await self.kubelet.start()
        self.agent.start()
        self.allocator.start()
        self.admitter.start()

    async def wait_ready(self) -> None:
        """Until the allocator is registered with the kubelet and advertises every virtual device."""
        await self.kubelet.wait_devices(self._resource, self.devices)
        for resource, count in self._vendor_resources.items():
            await self.kubelet.wait_devices(resource, int(count))

    def bound(self, pod: Pod) -> None:
        """A pod bound to this node appeared: admit it once, in arrival order."""
        uid = pod.metadata.uid
        if uid not in self._seen:
            self._seen.add(uid)
            self._queue.put_nowait(pod)

    def gone(self, uid: str) -> None:
        self.kubelet.release(uid)

    def terminating(self, pod: Pod) -> None:
        """A pod of this node is being deleted gracefully (e.g. a preemption victim): its containers stop at
        once here, so the kubelet finishes the deletion, as a real one does when they have stopped."""
        meta = pod.metadata
        self.gone(meta.uid)
        if self._kube is None or meta.uid in self._terminated:
            return
        self._terminated.add(meta.uid)
        task = asyncio.create_task(self._kube.finish_deletion(meta.namespace, meta.name, meta.uid))
        self._finishing.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._finishing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("a terminating pod was not deleted: %s", task.exception())

    async def stop(self) -> None:
        for service in (self.admitter, self.allocator, self.agent):
            await service.stop()
        await self.kubelet.stop()


def _asks_for_gpus(pod: Pod, resource: str) -> bool:
    containers = (*pod.spec.init_containers, *pod.spec.containers)
    return any(resource in c.resources.limits or resource in c.resources.requests for c in containers)


def hand_over(nodes: Mapping[str, SimNode], change: Change[Pod]) -> None:
    """The kubelets' pod watch: each pod bound to one of ``nodes`` goes to its node; a deleted one is released."""
    pod = change.obj
    node = nodes.get(pod.spec.node_name)
    if node is None:
        return
    if change.type == "DELETED":
        node.gone(pod.metadata.uid)
    elif pod.metadata.deletion_timestamp is not None:
        node.terminating(pod)
    else:
        node.bound(pod)
