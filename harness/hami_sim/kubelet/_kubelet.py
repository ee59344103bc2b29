"""The emulator itself (see the package docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc

from hami_common.deviceplugin.rpc import (
    HEALTHY,
    KUBELET_SOCKET,
    VERSION,
    DevicePluginClient,
    RegistrationServicer,
    add_registration,
    pb,
    unix_target,
)
from hami_common.kube import Change, KubeClient, Pod, WatchCache, pod_source
from hami_common.podresources import ListedContainer, ListedPod, add_lister
from hami_common.quantity import as_int

__all__ = ["ContainerAdmission", "KubeletEmulator", "PluginView", "PodAdmission"]

log = logging.getLogger(__name__)

DIAL_TIMEOUT_S: Final = 10.0  # the kubelet's blocking dial of a registering plugin
PREFERRED_TIMEOUT_S: Final = 10.0
_RESERVED_PREFIX: Final = "kubernetes.io/"


@dataclass(frozen=True, slots=True)
class ContainerAdmission:
    name: str
    device_ids: tuple[str, ...]
    response: pb.ContainerAllocateResponse | None = None
    error: str = ""  # the plugin's gRPC error, as the kubelet would report it

    @property
    def envs(self) -> dict[str, str]:
        return dict(self.response.envs) if self.response is not None else {}


@dataclass(frozen=True, slots=True)
class PodAdmission:
    uid: str
    namespace: str
    name: str
    containers: tuple[ContainerAdmission, ...]

    @property
    def ok(self) -> bool:
        return all(not c.error for c in self.containers)

    def container(self, name: str) -> ContainerAdmission:
        return next(c for c in self.containers if c.name == name)


@dataclass(eq=False)
class PluginView:
    """What the kubelet knows of one registered plugin."""

    resource: str
    endpoint: str
    options: pb.DevicePluginOptions
    channel: Any
    client: DevicePluginClient
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health, from the last ListAndWatch message
    updates: int = 0
    task: asyncio.Task[None] | None = None

    @property
    def healthy(self) -> list[str]:
        return [i for i, h in self.devices.items() if h == HEALTHY]


def _is_extended_resource(name: str) -> bool:
    return "/" in name and not name.startswith(_RESERVED_PREFIX) and not name.startswith("requests.")


class _Registration(RegistrationServicer):  # type: ignore[misc]
    def __init__(self, kubelet: KubeletEmulator) -> None:
        self.kubelet = kubelet

    async def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:  # noqa: N802
        if request.version != VERSION:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        if not _is_extended_resource(request.resource_name):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid resource {request.resource_name!r}")
        try:
            await self.kubelet.connect(request)
        except (grpc.aio.AioRpcError, TimeoutError) as err:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot dial plugin {request.endpoint}: {err}")
        return pb.Empty()


class KubeletEmulator:
    """``await kubelet.start()`` … ``await kubelet.stop()``; or ``async with KubeletEmulator(dir) as kubelet``."""

    def __init__(
        self,
        plugin_dir: Path | str,
        *,
        node: str = "",
        dial_timeout: float = DIAL_TIMEOUT_S,
        pod_resources: Path | str | None = None,
    ) -> None:
        self.plugin_dir = Path(plugin_dir)
        # the PodResources socket (the kubelet's <root-dir>/pod-resources/kubelet.sock), served when given
        self.pod_resources = Path(pod_resources) if pod_resources is not None else None
        self._lister: Any = None
        # the active pods as the kubelet's List shows them: (namespace, name, app containers) and, per
        # container, the device IDs by resource it was allocated; a pod is listed from its admission on
        self._active: dict[str, tuple[str, str, tuple[str, ...]]] = {}
        self._held: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {}
        self.node = node
        self.dial_timeout = dial_timeout
        self.plugins: dict[str, PluginView] = {}
        self.admitted: dict[str, PodAdmission] = {}
        self.registrations = 0
        self.starts = 0
        self._server: Any = None
        self._changed = asyncio.Condition()
        self._admit_lock = asyncio.Lock()
        self._assigned: dict[str, dict[str, set[str]]] = {}  # resource -> pod uid -> device IDs
        self._queue: asyncio.Queue[Pod] = asyncio.Queue()
        self._queued: set[str] = set()

    @property
    def socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    # --- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Delete every socket in the directory (as a starting kubelet does), then serve ``kubelet.sock``."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(self.plugin_dir):
            with contextlib.suppress(OSError):
                if stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    os.unlink(entry.path)
        server = grpc.aio.server()
        add_registration(server, _Registration(self))
        server.add_insecure_port(unix_target(str(self.socket)))
        await server.start()
        self._server = server
        self.starts += 1
        if self.pod_resources is not None and self._lister is None:
            self.pod_resources.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                self.pod_resources.unlink()
            lister = grpc.aio.server()
            add_lister(lister, self._listed)
            lister.add_insecure_port(unix_target(str(self.pod_resources)))
            await lister.start()
            self._lister = lister

    async def stop(self) -> None:
        for view in list(self.plugins.values()):
            await self._disconnect(view)
        self.plugins.clear()
        if self._server is not None:
            await self._server.stop(0)
            self._server = None
        if self._lister is not None:
            await self._lister.stop(0)
            self._lister = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def __aenter__(self) -> KubeletEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- registration and ListAndWatch ---------------------------------------------------------------------

    async def connect(self, request: pb.RegisterRequest) -> None:
        """What the kubelet does inside ``Register``: dial the plugin, ask its options, start ListAndWatch."""
        channel = grpc.aio.insecure_channel(unix_target(str(self.plugin_dir / request.endpoint)))
        client = DevicePluginClient(channel)
        try:
            async with asyncio.timeout(self.dial_timeout):
                await channel.channel_ready()
            options = await client.options(deadline=self.dial_timeout)
        except BaseException:
            await channel.close()
            raise
        old = self.plugins.get(request.resource_name)
        if old is not None:
            await self._disconnect(old)  # the new endpoint replaces the old one
        view = PluginView(
            resource=request.resource_name, endpoint=request.endpoint, options=options, channel=channel, client=client
        )
        view.task = asyncio.create_task(self._list_and_watch(view), name=f"list-and-watch:{request.resource_name}")
        self.plugins[request.resource_name] = view
        async with self._changed:
            self.registrations += 1
            self._changed.notify_all()

    async def _disconnect(self, view: PluginView) -> None:
        if view.task is not None:
            view.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await view.task
        await view.channel.close()

    async def _list_and_watch(self, view: PluginView) -> None:
        try:
            async for reply in view.client.list_and_watch():
                async with self._changed:
                    view.devices = {d.ID: d.health for d in reply.devices}
                    view.updates += 1
                    self._changed.notify_all()
        except grpc.aio.AioRpcError as err:
            log.info("ListAndWatch of %s ended: %s", view.resource, err.code().name)
        async with self._changed:  # the plugin is gone: its devices are unhealthy until it registers again
            view.devices = dict.fromkeys(view.devices, "Unhealthy")
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        """Until ``predicate()`` holds; it is checked after every registration and ListAndWatch message."""
        async with self._changed:
            await self._changed.wait_for(predicate)

    async def wait_registered(self, count: int = 1) -> None:
        await self.wait_for(lambda: self.registrations >= count)

    async def wait_devices(self, resource: str, count: int) -> PluginView:
        """Until the plugin for ``resource`` advertises ``count`` healthy devices."""
        await self.wait_for(lambda: resource in self.plugins and len(self.plugins[resource].healthy) == count)
        return self.plugins[resource]

    # --- admission ---------------------------------------------------------------------------------------

    def _free(self, resource: str, view: PluginView) -> list[str]:
        taken = set().union(*self._assigned.get(resource, {}).values())
        return [i for i in view.healthy if i not in taken]

    async def admit(self, pod: Pod) -> PodAdmission:
        """Allocate every device-plugin resource of every container of ``pod``, as the kubelet does."""
        async with self._admit_lock:
            admission = await self._admit(pod)
        async with self._changed:
            self.admitted[pod.metadata.uid] = admission
            self._changed.notify_all()
        return admission

    async def _listed(self) -> list[ListedPod]:
        """The kubelet's PodResources ``List``: every active pod, each app container with the devices it holds
        (init containers that are not restartable are not listed; this emulator knows no restartable ones)."""
        return [
            ListedPod(namespace, name, tuple(ListedContainer(c, self._held.get(uid, {}).get(c, {})) for c in names))
            for uid, (namespace, name, names) in self._active.items()
        ]

    async def _admit(self, pod: Pod) -> PodAdmission:
        uid = pod.metadata.uid
        self._active[uid] = (pod.metadata.namespace, pod.metadata.name, tuple(c.name for c in pod.spec.containers))
        admission = await self._allocate_pod(pod)
        if not admission.ok:  # a rejected pod is failed: no longer active
            self._active.pop(uid, None)
            self._held.pop(uid, None)
        return admission

    async def _allocate_pod(self, pod: Pod) -> PodAdmission:
        uid = pod.metadata.uid
        results: list[ContainerAdmission] = []
        containers = [(c, True) for c in pod.spec.init_containers] + [(c, False) for c in pod.spec.containers]
        for container, init in containers:
            for resource, view in self.plugins.items():
                count = as_int(container.resources.limits.get(resource, "0")) or 0
                if count <= 0:
                    continue
                result = await self._allocate(uid, container.name, resource, view, count, reusable=not init)
                results.append(result)
                if result.error:
                    return PodAdmission(uid, pod.metadata.namespace, pod.metadata.name, tuple(results))
        return PodAdmission(uid, pod.metadata.namespace, pod.metadata.name, tuple(results))

    async def _allocate(
        self, uid: str, name: str, resource: str, view: PluginView, count: int, *, reusable: bool
    ) -> ContainerAdmission:
        pods = self._assigned.setdefault(resource, {})
        own = pods.setdefault(uid, set())
        available = self._free(resource, view) + (sorted(own) if reusable else [])
        if len(available) < count:
            return ContainerAdmission(name, (), error=f"requested {count} {resource}, {len(available)} available")
        chosen: list[str] = []
        try:
            if view.options.get_preferred_allocation_available:
                request = pb.PreferredAllocationRequest(
                    container_requests=[
                        pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=count)
                    ]
                )
                reply = await view.client.preferred(request, deadline=PREFERRED_TIMEOUT_S)
                if reply.container_responses:
                    chosen = [i for i in reply.container_responses[0].deviceIDs if i in available][:count]
            chosen += [i for i in available if i not in chosen][: count - len(chosen)]
            answer = await view.client.allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)])
            )
        except grpc.aio.AioRpcError as err:
            return ContainerAdmission(name, tuple(chosen), error=f"{err.code().name}: {err.details()}")
        if not answer.container_responses:
            return ContainerAdmission(name, tuple(chosen), error="the plugin answered no container response")
        own.update(chosen)
        self._held.setdefault(uid, {}).setdefault(name, {})[resource] = tuple(chosen)
        return ContainerAdmission(name, tuple(chosen), answer.container_responses[0])

    def release(self, uid: str) -> None:
        """The pod is gone: its devices are free again."""
        for pods in self._assigned.values():
            pods.pop(uid, None)
        self._active.pop(uid, None)
        self._held.pop(uid, None)

    async def wait_admitted(self, uid: str) -> PodAdmission:
        await self.wait_for(lambda: uid in self.admitted)
        return self.admitted[uid]

    # --- pods bound to this node, from the apiserver ------------------------------------------------------

    def _on_pod(self, change: Change[Pod]) -> None:
        pod = change.obj
        uid = pod.metadata.uid
        if change.type == "DELETED":
            self.release(uid)
            return
        if pod.spec.node_name == self.node and uid not in self._queued:
            self._queued.add(uid)
            self._queue.put_nowait(pod)

    async def run_pods(self, kube: KubeClient) -> None:
        """Admit each pod bound to this node as it appears (watch through the apiserver); until cancelled."""
        if not self.node:
            raise ValueError("a node name is needed to follow the pods bound to it")
        cache = WatchCache(pod_source(kube, field_selector=f"spec.nodeName={self.node}"), name="kubelet pods")
        cache.add_handler(self._on_pod)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(cache.run())
            while True:
                pod = await self._queue.get()
                await self.admit(pod)

    def admit_all(self, pods: Iterable[Pod]) -> None:
        """Queue pods given directly, for :meth:`run_pods`' loop (or call :meth:`admit` yourself)."""
        for pod in pods:
            self._on_pod(Change("ADDED", pod))
