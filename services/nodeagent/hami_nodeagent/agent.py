"""The node agent assembled: one pod watch, the registrar, the pre-stager's consumer, the usage monitor.

:class:`NodeAgent` wires the parts to a connected bus, a kube client and an inventory, and
:meth:`NodeAgent.run` owns every long-lived task in one TaskGroup until ``stop`` is set. :func:`serve` is
the process body ``main`` runs: it opens the inventory, NATS and the apiserver, and closes them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import nats.errors

from hami_common import logkeys, subjects
from hami_common.bus import Bus, Subscription, placement_consumer
from hami_common.errors import TransientError
from hami_common.events import PlacementDecision, PodEnded
from hami_common.inventory import GpuInventory, NodeDeviceConfig, open_inventory
from hami_common.kube import EventRecorder, KubeClient, Pod
from hami_common.staging import StagingStore
from hami_common.subjects import PLACEMENT_STREAM
from hami_common.vendors.plugin import plugins
from hami_nodeagent.draslices import KubeSlices, SlicePublisher
from hami_nodeagent.pods import PodIndex, node_pod_cache
from hami_nodeagent.prestage import Prestager
from hami_nodeagent.registration import Registrar
from hami_nodeagent.settings import NodeAgentSettings
from hami_nodeagent.usage import UsageMonitor

__all__ = ["COMPONENT", "NodeAgent", "device_config", "run_connected", "serve"]

log = logging.getLogger(__name__)

COMPONENT: Final = "hami-nodeagent"
_RETRY_FIRST_S: Final = 0.25
_RETRY_MAX_S: Final = 10.0
_CLOSED_POLL_S: Final = 1.0  # how often the agent looks whether nats-py gave its connection up


def device_config(settings: NodeAgentSettings) -> NodeDeviceConfig:
    """The device config's values with this node's ``nodeconfig`` entry and the flags given on top."""
    return settings.node_config()


class NodeAgent:
    def __init__(self, settings: NodeAgentSettings, bus: Bus, kube: KubeClient, inventory: GpuInventory) -> None:
        node = settings.node_name
        device = device_config(settings)
        allocation = settings.allocation_config(device)
        self.settings = settings
        self.bus = bus
        self.pods = PodIndex(node_pod_cache(kube, node))
        self.registrar = Registrar(
            node=node,
            inventory=inventory,
            nodes=kube,
            publisher=bus,
            config=device,
            topology=settings.topology_score,
            events=EventRecorder(kube, COMPONENT, host=node),
            register_interval=settings.register_interval,
            health_interval=settings.health_interval,
            plugins=plugins(settings.device_config().families),
        )
        self.prestager = Prestager(
            node=node,
            store=StagingStore(settings.staging_dir),
            config=allocation,
            pods=self.pods,
            orphan_grace=settings.orphan_grace,
        )
        self.usage = UsageMonitor(
            node=node,
            root=Path(allocation.vgpu_dir) / "containers",
            inventory=inventory,
            pods=self.pods,
            publisher=bus,
            interval=settings.usage_interval,
            dir_grace=settings.cache_dir_grace,
            feedback=settings.priority_feedback,
            limits_root=Path(allocation.limits_host_dir or f"{allocation.vgpu_dir}/limits"),
        )
        # DRA mode: kube-scheduler allocates from the node's ResourceSlices (the registration stays, harmless)
        self.slices: SlicePublisher | None = None
        if settings.dra:
            self.slices = SlicePublisher(
                node=node,
                inventory=inventory,
                store=KubeSlices(kube),
                config=device,
                check_interval=settings.register_interval,
                poll_interval=settings.health_interval,
            )
        self.consumer: Subscription | None = None
        self._ended: asyncio.Queue[Pod] = asyncio.Queue()
        self.pods.on_gone.append(self._ended.put_nowait)

    async def start_consumer(self) -> Subscription:
        """Declare the stream and the node's durable consumer, and start consuming; retried until it works
        (JetStream may still be electing or recovering when the agent starts)."""
        spec = placement_consumer(self.settings.node_name, ack_wait_s=self.settings.placement_ack_wait)
        delay = _RETRY_FIRST_S
        while True:
            try:
                # the extender alone declares the stream (a node may not create or change it, nats.conf):
                # until it exists, creating the consumer fails and this loop retries
                self.consumer = await self.bus.consume(
                    PLACEMENT_STREAM, spec, PlacementDecision, self.prestager.on_placement
                )
                log.info("consuming the placements of %s as %s", self.settings.node_name, spec.durable)
                return self.consumer
            except (nats.errors.Error, TransientError) as err:
                log.warning("placement consumer not started, retrying in %.1fs: %s", delay, err)
            await asyncio.sleep(delay)  # backoff between attempts
            delay = min(delay * 2, _RETRY_MAX_S)

    async def announce_ended(self) -> None:
        """Publish a PodEnded for every pod the watch sees deleted or finished, so its series go at once."""
        node = self.settings.node_name
        while True:
            pod = await self._ended.get()
            meta = pod.metadata
            event = PodEnded(
                node=node, pod_uid=meta.uid, namespace=meta.namespace, name=meta.name, at_ns=time.time_ns()
            )
            try:
                await self.bus.publish(subjects.usage(node), event)
            except nats.errors.Error as err:
                log.info("end of pod %s not announced: %s", meta.uid, err, extra={logkeys.POD_UID: meta.uid})

    async def run(self, stop: asyncio.Event) -> None:
        """Run every part until ``stop`` is set; then stop the consumer and cancel the loops."""
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(self.pods.cache.run(), name="pod-watch"),
                group.create_task(self.registrar.run(), name="registration"),
                group.create_task(self.usage.run(), name="usage"),
                group.create_task(self.prestager.run_reconciler(), name="staging-reconciler"),
                group.create_task(self.announce_ended(), name="pod-ended"),
            ]
            if self.slices is not None:
                tasks.append(group.create_task(self.slices.run(), name="dra-slices"))
            starting = group.create_task(self.start_consumer(), name="placement-consumer")
            await stop.wait()
            starting.cancel()
            if self.consumer is not None:
                await self.consumer.stop()
            for task in tasks:
                task.cancel()


async def _halt_when_closed(bus: Bus, stop: asyncio.Event, halt: asyncio.Event) -> None:
    """Set ``halt`` when ``stop`` is set or the connection is closed for good."""
    while not bus.closed:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_CLOSED_POLL_S):
                await stop.wait()
                break
    halt.set()


async def run_connected(
    settings: NodeAgentSettings,
    kube: KubeClient,
    inventory: GpuInventory,
    stop: asyncio.Event,
    connect: Callable[[NodeAgentSettings], Awaitable[Bus]] = Bus.connect,
) -> None:
    """Run the agent until ``stop`` is set. nats-py gives a connection up for good when a reconnect is refused
    (seen when the auth callout answered too slowly under load), and a closed connection never delivers a
    placement again: then the agent's parts stop and start again on a new connection."""
    while not stop.is_set():
        async with await connect(settings) as bus:
            halt = asyncio.Event()
            watcher = asyncio.create_task(_halt_when_closed(bus, stop, halt), name="nats-closed")
            try:
                await NodeAgent(settings, bus, kube, inventory).run(halt)
            finally:
                watcher.cancel()
        if not stop.is_set():
            log.warning("the NATS connection was closed for good; starting again on a new one")


async def serve(settings: NodeAgentSettings, stop: asyncio.Event) -> None:
    inventory = await asyncio.to_thread(
        open_inventory, settings.inventory, node=settings.node_name, fake_file=settings.fake_inventory
    )
    try:
        async with KubeClient.from_settings(settings) as kube:
            await run_connected(settings, kube, inventory, stop)
    finally:
        inventory.close()
