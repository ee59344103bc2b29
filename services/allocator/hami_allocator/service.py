"""The allocator assembled: the plugin server, the follow-up worker, the watch of this node's pods.

:class:`AllocatorService` takes its parts as ports, so a test passes the kube emulator's client, a bus or
none, and an inventory of its choosing; :func:`serve` builds it from :class:`AllocatorSettings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from pathlib import Path

import msgspec
from opentelemetry.context import Context

from hami_allocator.admitting import KubeletPods
from hami_allocator.allocator import Allocator
from hami_allocator.followup import FollowUp, ResultPublisher
from hami_allocator.inventory import DeclaredInventory, DiscoveredInventory, GpuSource, parse_declared
from hami_allocator.mig import MigInstances
from hami_allocator.pending import KubeNodePods
from hami_allocator.plugin import DevicePluginService
from hami_allocator.server import Endpoint, PluginServer
from hami_allocator.settings import AllocatorSettings
from hami_allocator.vendors import VendorNode, VendorPluginService, erase_keys
from hami_common.allocation import NodeAllocationConfig
from hami_common.bus import Bus
from hami_common.errors import HamiError, InvalidInput, TransientError
from hami_common.grants import GrantKey
from hami_common.inventory import (
    MODE_MIG,
    MigControl,
    MigRefused,
    NodeDeviceConfig,
    NvmlMigControl,
    open_inventory,
    open_mig_control,
)
from hami_common.kube import Change, KubeClient, Node, Pod, WatchCache, node_source, pod_source
from hami_common.podresources import PodResourcesClient
from hami_common.resources import GPU_PRIORITY
from hami_common.service import EXIT_CONFIG
from hami_common.settings import BusSettings
from hami_common.staging import StagingStore
from hami_common.vendors.plugin import plugins

__all__ = ["AllocatorService", "LazyBus", "serve"]

log = logging.getLogger(__name__)

_TERMINAL = frozenset({"Succeeded", "Failed"})


class LazyBus:
    """A publisher that connects in the background and drops results while NATS is unreachable:
    allocation never waits for the bus (ARCHITECTURE §3)."""

    def __init__(self, settings: BusSettings) -> None:
        self.settings = settings
        self.bus: Bus | None = None
        self.dropped = 0
        self._reconnecting: asyncio.Task[None] | None = None

    async def run(self) -> None:
        while self.bus is None:
            try:
                self.bus = await Bus.connect(self.settings, give_up_after=30.0)
            except TransientError as err:
                log.info("NATS not reachable, allocation results are not published: %s", err)

    async def publish(self, subject: str, event: msgspec.Struct, *, ctx: Context | None = None) -> None:
        if self.bus is not None and self.bus.closed:
            # nats-py gave the connection up (seen when the auth callout refused a reconnect under load): a
            # new one is made meanwhile; results are best effort, the pod's bind-phase is the record
            log.warning("NATS connection closed; reconnecting, allocation results are dropped meanwhile")
            self.bus = None
            self._reconnecting = asyncio.create_task(self.run(), name="results-reconnect")
        if self.bus is None:
            self.dropped += 1
            return
        await self.bus.publish(subject, event, ctx=ctx)

    async def close(self) -> None:
        if self._reconnecting is not None:
            self._reconnecting.cancel()
        if self.bus is not None:
            await self.bus.drain()


class AllocatorService:
    def __init__(
        self,
        *,
        node: str,
        endpoint: Endpoint,
        inventory: GpuSource,
        store: StagingStore,
        config: NodeAllocationConfig,
        split: int = 10,
        kube: KubeClient | None = None,
        publisher: ResultPublisher | None = None,
        numa_topology: bool = False,
        grant_key: GrantKey | None = None,
        priority_name: str = GPU_PRIORITY,
        mig: MigControl | None = None,
        mig_grace: float = 60.0,
        mig_reclaim_interval: float = 30.0,
        kubelet_pods: KubeletPods | None = None,
    ) -> None:
        self.node = node
        self.mig_reclaim_interval = mig_reclaim_interval
        self._reclaim_wake = asyncio.Event()
        self.kube = kube
        self.pods: WatchCache[Pod] | None = None
        self.nodes: WatchCache[Node] | None = None  # this node only: the lock release reads it from here
        self.followup = FollowUp(node, pods=kube, nodes=kube, publisher=publisher)
        if kube is not None:
            self.pods = WatchCache(pod_source(kube, field_selector=f"spec.nodeName={node}"), name=f"pods on {node}")
            self.nodes = WatchCache(node_source(kube, field_selector=f"metadata.name={node}"), name=f"node {node}")
            self.followup.known_pod = self.pods.get
            self.followup.known_node = functools.partial(self.nodes.get, "", node)
        self.allocator = Allocator(
            node,
            store=store,
            config=config,
            inventory=inventory,
            split=split,
            followup=self.followup,
            pods=KubeNodePods(kube) if kube is not None else None,
            grant_key=grant_key,
            priority_name=priority_name,
            mig=MigInstances(mig, node=node, grace=mig_grace) if mig is not None else None,
            resource=endpoint.resource_name,
            kubelet_pods=kubelet_pods,
        )
        self.plugin = DevicePluginService(
            self.allocator, preferred_available=endpoint.preferred_available, numa_topology=numa_topology
        )
        self.server = PluginServer.for_plugin(endpoint, self.plugin)
        if self.pods is not None:
            self.pods.add_handler(self._on_pod)
            self.allocator.known_pods = self.pods.items
            self.allocator.known_pods_synced = self.pods.synced.is_set

    def _on_pod(self, change: Change[Pod]) -> None:
        pod = change.obj
        if change.type == "DELETED" or pod.status.phase in _TERMINAL:
            self.allocator.ended(pod.metadata.uid)
            self._reclaim_wake.set()  # its MIG instances, if any, go now
        elif pod.metadata.deletion_timestamp:
            self.allocator.forget(pod.metadata.uid)  # never served again; its containers may still run

    async def reclaim_mig(self) -> None:
        """Destroy unowned MIG instances once the pod watch has synced (at start), whenever a pod ends, and
        every ``mig_reclaim_interval`` seconds. A driver error is logged and tried again at the next pass."""
        if self.pods is None:
            return  # without the node's pods, ownership cannot be told: nothing is destroyed
        await self.pods.synced.wait()
        while True:
            self._reclaim_wake.clear()
            try:
                await self.allocator.reclaim_mig()
            except (HamiError, MigRefused, OSError) as err:
                log.warning("reclaiming MIG instances failed: %s", err)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.mig_reclaim_interval):
                    await self._reclaim_wake.wait()

    async def run(self) -> None:
        """Serve until cancelled."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.server.run(), name="plugin-server")
            tg.create_task(self.followup.run(), name="allocation-follow-up")
            if self.pods is not None:
                tg.create_task(self.pods.run(), name="node-pods-watch")
            if self.nodes is not None:
                tg.create_task(self.nodes.run(), name="node-watch")
            if self.allocator.mig is not None:
                tg.create_task(self.reclaim_mig(), name="mig-reclaim")


async def _inventory(
    settings: AllocatorSettings, node: NodeDeviceConfig, stack: contextlib.AsyncExitStack
) -> DeclaredInventory:
    """The node agent's discovery when ``--inventory`` names it, else the declared ``--gpus``."""
    if settings.inventory:
        if settings.gpus:
            raise InvalidInput("choose GPU discovery (--inventory) or declared GPUs (--gpus), not both")
        backend = await asyncio.to_thread(
            open_inventory, settings.inventory, node=settings.node_name, fake_file=settings.fake_inventory
        )
        stack.callback(backend.close)
        discovered = DiscoveredInventory(backend, settings.inventory_poll, visible=node.registers)
        await discovered.refresh()
        return discovered
    try:
        gpus = parse_declared(settings.gpus)
    except ValueError as err:
        raise InvalidInput(f"--gpus: {err}") from err
    gpus = tuple(g for g in gpus if node.registers(g.uuid, None))
    if not gpus:
        log.warning("no GPU to advertise: set --inventory (nvml or fake) or --gpus")
    return DeclaredInventory(gpus)


async def _mig_control(
    settings: AllocatorSettings, node: NodeDeviceConfig, stack: contextlib.AsyncExitStack
) -> MigControl | None:
    """The node's MIG driver when its config says ``operatingmode: mig``, over the same discovery as the
    node agent's (for the fake inventory, the same shared state file)."""
    if node.mode != MODE_MIG:
        return None
    if not settings.inventory:
        raise InvalidInput("operatingmode mig needs GPU discovery (--inventory nvml or fake), not declared --gpus")
    control = await asyncio.to_thread(
        open_mig_control, settings.inventory, node=settings.node_name, fake_file=settings.fake_inventory
    )
    if isinstance(control, NvmlMigControl):
        stack.callback(control.close)
    return control


async def _vendor_servers(
    settings: AllocatorSettings,
    inventory: DeclaredInventory,
    kube: KubeClient | None,
    kubelet_pods: KubeletPods | None = None,
) -> list[PluginServer]:
    """One plugin server per resource of every configured family with declared devices on this node."""
    if not isinstance(inventory, DiscoveredInventory):
        return []
    found = await asyncio.to_thread(inventory.backend.gpus)
    configured = plugins(settings.device_config().families)
    keys = erase_keys(configured)
    servers = []
    for plugin in configured:
        mine = tuple(g for g in found if plugin.owns(g))
        if not mine:
            continue
        vendor = VendorNode(
            node=settings.node_name,
            plugin=plugin,
            gpus=mine,
            pods=KubeNodePods(kube) if kube is not None else None,
            kube=kube,
            erase_keys=keys,
            host_root=Path(settings.vendor_host_root),
            hook_path=settings.hook_path,
            kubelet_pods=kubelet_pods,
        )
        for resource in plugin.advertised(settings.node_name, mine):
            endpoint = Endpoint(
                plugin_dir=Path(settings.plugin_dir),
                socket_name=plugin.socket_name(resource),
                resource_name=resource,
                register_timeout=settings.register_timeout,
                watch_interval=settings.watch_interval,
            )
            servers.append(PluginServer.for_plugin(endpoint, VendorPluginService(vendor, resource)))
            log.info("serving %s for %d declared %s devices", resource, len(mine), plugin.family.word)
    return servers


async def serve(settings: AllocatorSettings, stop: asyncio.Event) -> None:
    """The service body for ``hami_common.service.run``: serve until ``stop`` is set."""
    async with contextlib.AsyncExitStack() as stack:
        try:
            if not settings.node_name:
                raise InvalidInput("the node name is required (--node-name or HAMI_NODE_NAME)")
            # the node agent applies the same entry: the slots it registers are the devices advertised here
            node = settings.node_config()
            inventory = await _inventory(settings, node, stack)
            mig = await _mig_control(settings, node, stack)
            grant_key = settings.grant_key()
        except InvalidInput as err:
            log.error("bad configuration: %s", err)
            raise SystemExit(EXIT_CONFIG) from err
        endpoint = Endpoint(
            plugin_dir=Path(settings.plugin_dir),
            socket_name=settings.socket_name,
            resource_name=settings.advertised_resource(),
            preferred_available=node.preferred_allocation,
            register_timeout=settings.register_timeout,
            watch_interval=settings.watch_interval,
        )
        kube = None
        if settings.use_apiserver:
            kube = await stack.enter_async_context(KubeClient.from_settings(settings))
        bus = LazyBus(settings) if settings.use_bus else None
        if bus is not None:
            stack.push_async_callback(bus.close)
        kubelet_pods = None
        if settings.pod_resources_socket:
            lister = PodResourcesClient(settings.pod_resources_socket)
            stack.push_async_callback(lister.close)
            kubelet_pods = lister.list
        else:
            log.warning(
                "no --pod-resources-socket: the pod an Allocate is for is guessed (the oldest pending grant), "
                "as HAMi guesses it, not asked of the kubelet"
            )
        service = AllocatorService(
            node=settings.node_name,
            endpoint=endpoint,
            inventory=inventory,
            store=StagingStore(settings.staging_dir),
            config=settings.allocation_config(node),
            split=node.split_count,
            kube=kube,
            publisher=bus,
            numa_topology=node.numa_topology,
            grant_key=grant_key,
            priority_name=settings.device_config().resources.priority_name,
            mig=mig,
            mig_grace=settings.mig_reclaim_grace,
            mig_reclaim_interval=settings.mig_reclaim_interval,
            kubelet_pods=kubelet_pods,
        )
        vendor_servers = await _vendor_servers(settings, inventory, kube, kubelet_pods)
        if grant_key is None and settings.use_apiserver:
            log.warning("no grant key (--grant-key-file): pods are served from staged placements only")
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(service.run(), name="allocator")]
            if bus is not None:
                tasks.append(tg.create_task(bus.run(), name="bus-connect"))
            if isinstance(inventory, DiscoveredInventory):
                tasks.append(tg.create_task(inventory.run(), name="gpu-discovery"))
            for server in vendor_servers:
                tasks.append(tg.create_task(server.run(), name=f"plugin:{server.endpoint.resource_name}"))
            await stop.wait()
            for task in tasks:
                task.cancel()
