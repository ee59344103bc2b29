"""The node agent's DRA mode (``--dra``; docs/dra.md): this node's GPUs published as ResourceSlices.

In DRA mode kube-scheduler allocates GPUs from ResourceSlices, not from HAMi's node annotations. The
:class:`SlicePublisher` polls the inventory as the registrar does and writes the node's pool
(:func:`hami_common.dra.slices.node_slices`) whenever its devices change, with the next pool generation, so
the scheduler drops the old devices at once. Every ``check_interval`` it also lists the node's slices on the
apiserver and writes them again if they are not what it wrote: the kubelet deletes a node's slices when it
starts and a while after a kubelet plugin leaves, and this agent is not a registered kubelet plugin.

Slices are left in place when the agent stops: a restarted agent takes them over (same names, next
generation), and the Node owns them, so they go with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import msgspec
from kubernetes import client

from hami_common import logkeys
from hami_common.dra.names import DRIVER
from hami_common.dra.objects import Device, ResourceSlice
from hami_common.dra.slices import SLICE_LABEL, node_slices, slice_devices
from hami_common.errors import HamiError, NotFound
from hami_common.inventory import GpuInventory, NodeDeviceConfig
from hami_common.kube import KubeClient

__all__ = ["KubeSlices", "PublishedSlice", "SlicePublisher", "SliceStore"]

log = logging.getLogger(__name__)

_SELECTOR: Final = f"{SLICE_LABEL}=true"


class _Pool(msgspec.Struct, frozen=True):
    generation: int = 0


class _Spec(msgspec.Struct, frozen=True):
    pool: _Pool = msgspec.field(default_factory=_Pool)


class _Meta(msgspec.Struct, frozen=True, rename="camel"):
    name: str = ""
    resource_version: str = ""


class PublishedSlice(msgspec.Struct, frozen=True):
    """What the publisher reads back of a slice on the apiserver: enough to replace or remove it."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)


class SliceStore(Protocol):
    """Where a node's slices live (:class:`KubeSlices`, or a test's dictionary)."""

    async def node_uid(self, node: str) -> str: ...

    async def list(self, node: str) -> list[PublishedSlice]: ...

    async def create(self, body: ResourceSlice) -> None: ...

    async def replace(self, body: ResourceSlice, resource_version: str) -> None: ...

    async def delete(self, name: str) -> None: ...


class KubeSlices:
    """The node's slices on the apiserver, through the project's one kube client."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self._api = client.ResourceV1Api(kube.api_client)

    async def node_uid(self, node: str) -> str:
        return (await self._kube.get_node(node)).metadata.uid

    async def list(self, node: str) -> list[PublishedSlice]:
        # only this agent's slices of this node: another driver's, or HAMi's own plugin's, are not ours to touch
        selectors = {"label_selector": _SELECTOR, "field_selector": f"spec.nodeName={node},spec.driver={DRIVER}"}
        items, _ = await self._kube.list_all(
            f"resourceslices of {node}", PublishedSlice, self._api.list_resource_slice, **selectors
        )
        return items

    async def create(self, body: ResourceSlice) -> None:
        await self._kube.call_raw(f"resourceslice {body.metadata.name}", self._api.create_resource_slice, _json(body))

    async def replace(self, body: ResourceSlice, resource_version: str) -> None:
        json = _json(body)
        json["metadata"]["resourceVersion"] = resource_version  # a guarded replace: 409 if it changed meanwhile
        name = body.metadata.name
        await self._kube.call_raw(f"resourceslice {name}", self._api.replace_resource_slice, name, json)

    async def delete(self, name: str) -> None:
        await self._kube.call_raw(f"resourceslice {name}", self._api.delete_resource_slice, name)


def _json(body: ResourceSlice) -> dict[str, Any]:
    json: dict[str, Any] = msgspec.to_builtins(body)
    return json


@dataclass(eq=False)
class SlicePublisher:
    node: str
    inventory: GpuInventory
    store: SliceStore
    config: NodeDeviceConfig = field(default_factory=NodeDeviceConfig)
    check_interval: float = 30.0
    poll_interval: float = 5.0
    writes: int = 0  # slices created, replaced or deleted: a test or a metric reads it
    generation: int = 0  # the pool generation last written (0: none yet)
    _devices: tuple[Device, ...] | None = None
    _names: frozenset[str] = frozenset()

    @property
    def devices(self) -> tuple[Device, ...]:
        """The devices last published (none before the first write)."""
        return self._devices or ()

    async def sync(self, *, check: bool = False) -> bool:
        """Poll the inventory once and write the pool if it changed (with ``check``: or if the apiserver's
        slices are not the ones last written). True if anything was written. Raises HamiError."""
        gpus = await asyncio.to_thread(self.inventory.gpus)
        devices = slice_devices(gpus, self.config)
        if devices == self._devices and not check:
            return False
        published = await self.store.list(self.node)
        if devices == self._devices and self._intact(published):
            return False
        await self._write(devices, published)
        return True

    def _intact(self, published: Sequence[PublishedSlice]) -> bool:
        return {s.metadata.name for s in published} == self._names and all(
            s.spec.pool.generation == self.generation for s in published
        )

    async def _write(self, devices: tuple[Device, ...], published: Sequence[PublishedSlice]) -> None:
        # read at every write (writes are rare): a Node deleted and registered again has a new uid, and slices
        # owned by the old one would be collected as soon as they are written
        uid = await self.store.node_uid(self.node)
        # past every generation seen, so a restarted agent's pool supersedes the one it left behind
        generation = max([self.generation, *(s.spec.pool.generation for s in published)]) + 1
        wanted = node_slices(self.node, devices, generation=generation, node_uid=uid)
        versions = {s.metadata.name: s.metadata.resource_version for s in published}
        for body in wanted:
            name = body.metadata.name
            if name in versions:
                await self.store.replace(body, versions[name])
            else:
                await self.store.create(body)
            self.writes += 1
        names = frozenset(s.metadata.name for s in wanted)
        for name in versions.keys() - names:
            with contextlib.suppress(NotFound):  # gone already: what was wanted
                await self.store.delete(name)
            self.writes += 1
        self.generation, self._devices, self._names = generation, devices, names
        extra = {logkeys.NODE: self.node}
        log.info("published %d GPUs of %s as pool generation %d", len(devices), self.node, generation, extra=extra)

    async def run(self) -> None:
        """Sync every ``poll_interval``, checking the apiserver every ``check_interval``, until cancelled.

        A failed sync (inventory unreadable, apiserver down, a slice changed meanwhile) is logged and
        retried at the next poll with a full check."""
        loop = asyncio.get_running_loop()
        next_check = loop.time()
        while True:
            check = loop.time() >= next_check
            try:
                await self.sync(check=check)
                if check:
                    next_check = loop.time() + self.check_interval
            except HamiError as err:
                log.warning("slices of %s not published, retrying: %s", self.node, err, extra={logkeys.NODE: self.node})
                next_check = loop.time()
            except Exception:  # the loop's edge: a bug is logged with its traceback, the agent keeps serving
                log.exception("slices of %s not published", self.node)
                next_check = loop.time()
            await asyncio.sleep(self.poll_interval)  # the poll period, not a wait for a condition
