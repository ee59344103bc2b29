"""The plugin's socket and its registration with the kubelet (k8s-interfaces §1.4).

1. serve ``v1beta1.DevicePlugin`` on ``<plugin-dir>/<name>.sock`` (a stale file is removed first);
2. call ``Register`` on ``<plugin-dir>/kubelet.sock`` (retried until the kubelet answers);
3. watch: when the kubelet restarts it deletes every socket in the directory and creates ``kubelet.sock``
   again, so a vanished plugin socket or a new ``kubelet.sock`` (another inode or ctime) means: stop the
   server, serve again, register again. The files are checked every ``watch_interval`` seconds (a stat of
   two paths; no inotify dependency).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import grpc

from hami_common.deviceplugin.rpc import KUBELET_SOCKET, VERSION, RegistrationClient, add_device_plugin, pb, unix_target

__all__ = ["Endpoint", "PluginServer"]

log = logging.getLogger(__name__)

_STOP_GRACE_S: Final = 0.5
FileId = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Endpoint:
    plugin_dir: Path
    socket_name: str
    resource_name: str
    preferred_available: bool = False
    register_timeout: float = 10.0
    watch_interval: float = 1.0

    @property
    def socket(self) -> Path:
        return self.plugin_dir / self.socket_name

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET


def _file_id(path: Path) -> FileId | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


class PluginServer:
    """Serves and registers until cancelled; ``registrations`` counts successful ``Register`` calls."""

    def __init__(self, endpoint: Endpoint, add_servicers: Callable[[grpc.aio.Server], None]) -> None:
        self.endpoint = endpoint
        self._add_servicers = add_servicers
        self.registrations = 0
        self._registered = asyncio.Condition()

    @classmethod
    def for_plugin(cls, endpoint: Endpoint, servicer: object) -> PluginServer:
        return cls(endpoint, lambda server: add_device_plugin(server, servicer))

    async def wait_registered(self, count: int = 1) -> None:
        """Until ``Register`` has succeeded ``count`` times in total."""
        async with self._registered:
            await self._registered.wait_for(lambda: self.registrations >= count)

    async def run(self) -> None:
        ep = self.endpoint
        while True:
            server = await self._serve()
            try:
                kubelet = await self._register()
                if kubelet is not None:
                    await self._watch(kubelet)
                log.info("kubelet restarted or %s vanished: serving and registering again", ep.socket_name)
            finally:
                await server.stop(_STOP_GRACE_S)

    async def _serve(self) -> grpc.aio.Server:
        ep = self.endpoint
        ep.plugin_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            ep.socket.unlink()
        server = grpc.aio.server()
        self._add_servicers(server)
        server.add_insecure_port(unix_target(str(ep.socket)))
        await server.start()
        log.info("device plugin serving on %s", ep.socket)
        return server

    async def _register(self) -> FileId | None:
        """Register; the kubelet.sock registered with, or None if our own socket vanished meanwhile."""
        ep = self.endpoint
        request = pb.RegisterRequest(
            version=VERSION,
            endpoint=ep.socket_name,
            resource_name=ep.resource_name,
            options=pb.DevicePluginOptions(
                pre_start_required=False, get_preferred_allocation_available=ep.preferred_available
            ),
        )
        reported = False
        while True:
            if _file_id(ep.socket) is None:
                return None
            kubelet = _file_id(ep.kubelet_socket)
            if kubelet is not None:
                try:
                    async with grpc.aio.insecure_channel(unix_target(str(ep.kubelet_socket))) as channel:
                        await RegistrationClient(channel).register(request, deadline=ep.register_timeout)
                except grpc.aio.AioRpcError as err:
                    if not reported:
                        log.warning(
                            "registration with the kubelet failed (%s): %s; retrying", err.code().name, err.details()
                        )
                        reported = True
                else:
                    async with self._registered:
                        self.registrations += 1
                        self._registered.notify_all()
                    log.info("registered %s with the kubelet as %s", ep.resource_name, ep.socket_name)
                    return kubelet
            await asyncio.sleep(ep.watch_interval)  # the kubelet is not there yet: look again

    async def _watch(self, kubelet: FileId) -> None:
        ep = self.endpoint
        while True:
            if _file_id(ep.socket) is None or _file_id(ep.kubelet_socket) != kubelet:
                return
            await asyncio.sleep(ep.watch_interval)  # polling two stats: the kubelet gives no other signal
