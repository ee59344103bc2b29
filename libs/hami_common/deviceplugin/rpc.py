"""Typed glue over the generated ``v1beta1`` stubs: constants, servicer registration and clients.

Both the device plugin and the kubelet emulator (``hami_sim.kubelet``) speak the API through this
module, so the generated, untyped gRPC code is touched in one place only. Every client call takes a
deadline; ``ListAndWatch`` has none, as the kubelet's has none.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Final

import grpc

from hami_common.deviceplugin import api_pb2 as pb
from hami_common.deviceplugin import api_pb2_grpc as pb_grpc

__all__ = [
    "DEVICE_PLUGIN_PATH",
    "HEALTHY",
    "KUBELET_SOCKET",
    "UNHEALTHY",
    "VERSION",
    "DevicePluginClient",
    "DevicePluginServicer",
    "RegistrationClient",
    "RegistrationServicer",
    "add_device_plugin",
    "add_registration",
    "pb",
    "unix_target",
]

VERSION: Final = "v1beta1"
DEVICE_PLUGIN_PATH: Final = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET: Final = "kubelet.sock"
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"

DevicePluginServicer: Any = pb_grpc.DevicePluginServicer
RegistrationServicer: Any = pb_grpc.RegistrationServicer


def unix_target(path: str) -> str:
    """The gRPC target of a unix socket path (absolute: ``unix:///…``)."""
    return f"unix://{path}" if path.startswith("/") else f"unix:{path}"


def add_device_plugin(server: grpc.aio.Server, servicer: object) -> None:
    pb_grpc.add_DevicePluginServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


def add_registration(server: grpc.aio.Server, servicer: object) -> None:
    pb_grpc.add_RegistrationServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


class RegistrationClient:
    """The plugin's side of ``kubelet.sock``."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]

    async def register(self, request: pb.RegisterRequest, *, deadline: float) -> None:
        await self._stub.Register(request, timeout=deadline)


class DevicePluginClient:
    """The kubelet's side of a plugin's socket."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = pb_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]

    async def options(self, *, deadline: float) -> pb.DevicePluginOptions:
        reply: pb.DevicePluginOptions = await self._stub.GetDevicePluginOptions(pb.Empty(), timeout=deadline)
        return reply

    async def list_and_watch(self) -> AsyncIterator[pb.ListAndWatchResponse]:
        call = self._stub.ListAndWatch(pb.Empty())
        try:
            async for reply in call:
                yield reply
        finally:
            call.cancel()

    async def preferred(
        self, request: pb.PreferredAllocationRequest, *, deadline: float
    ) -> pb.PreferredAllocationResponse:
        reply: pb.PreferredAllocationResponse = await self._stub.GetPreferredAllocation(request, timeout=deadline)
        return reply

    async def allocate(self, request: pb.AllocateRequest, *, deadline: float | None = None) -> pb.AllocateResponse:
        reply: pb.AllocateResponse = await self._stub.Allocate(request, timeout=deadline)
        return reply

    async def pre_start(self, request: pb.PreStartContainerRequest, *, deadline: float) -> pb.PreStartContainerResponse:
        reply: pb.PreStartContainerResponse = await self._stub.PreStartContainer(request, timeout=deadline)
        return reply
