"""The ``v1beta1.DevicePlugin`` gRPC service: the edge between the kubelet and :class:`.Allocator`.

Errors are mapped here and nowhere else (STYLE §2): ``InvalidInput`` → ``INVALID_ARGUMENT``, ``NotFound``
→ ``NOT_FOUND`` (no pod is waiting for this allocation), ``TransientError`` → ``UNAVAILABLE``, any other
``HamiError`` → ``INTERNAL``; each with one log line, and the server keeps serving. A bug surfaces as
gRPC's ``UNKNOWN``, with its traceback in the log.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, Final, NoReturn

import grpc

from hami_allocator.allocator import Allocator
from hami_allocator.followup import Served
from hami_allocator.inventory import InventorySnapshot, virtual_devices
from hami_common.allocation import ContainerResponse
from hami_common.deviceplugin.rpc import HEALTHY, UNHEALTHY, DevicePluginServicer, pb
from hami_common.errors import HamiError, InvalidInput, NotFound, TransientError

__all__ = ["DevicePluginService", "to_pb"]

log = logging.getLogger(__name__)

_CODES: Final = (
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (TransientError, grpc.StatusCode.UNAVAILABLE),
    (HamiError, grpc.StatusCode.INTERNAL),
)


def to_pb(response: ContainerResponse) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=response.envs,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in response.mounts
        ],
        devices=[
            pb.DeviceSpec(container_path=d.container_path, host_path=d.host_path, permissions=d.permissions)
            for d in response.devices
        ],
        annotations=response.annotations,
        cdi_devices=[pb.CDIDevice(name=name) for name in response.cdi_devices],
    )


async def _abort(context: Any, rpc: str, err: HamiError) -> NoReturn:
    code = next(c for kind, c in _CODES if isinstance(err, kind))
    log.warning("%s refused (%s): %s", rpc, code.name, err)
    await context.abort(code, f"{rpc}: {err}")
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


class DevicePluginService(DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, allocator: Allocator, *, preferred_available: bool, numa_topology: bool = False) -> None:
        self.allocator = allocator
        self.preferred_available = preferred_available
        self.numa_topology = numa_topology

    def _devices(self, snapshot: InventorySnapshot) -> pb.ListAndWatchResponse:
        devices = []
        for dev in virtual_devices(snapshot.gpus, self.allocator.split):
            device = pb.Device(ID=dev.id, health=HEALTHY if dev.healthy else UNHEALTHY)
            if self.numa_topology and dev.numa is not None:
                device.topology.nodes.append(pb.NUMANode(ID=dev.numa))
            devices.append(device)
        return pb.ListAndWatchResponse(devices=devices)

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:  # noqa: N802
        return pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=self.preferred_available
        )

    async def ListAndWatch(self, request: pb.Empty, context: Any) -> AsyncIterator[pb.ListAndWatchResponse]:  # noqa: N802
        """The full device list now and again after every inventory change (health included)."""
        inventory = self.allocator.inventory
        snapshot = inventory.snapshot()
        while True:
            yield self._devices(snapshot)
            snapshot = await inventory.wait_newer(snapshot.version)

    async def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        responses = []
        for creq in request.container_requests:
            if creq.allocation_size < 0:
                await _abort(context, "GetPreferredAllocation", InvalidInput("negative allocation_size"))
            ids = self.allocator.preferred(
                list(creq.available_deviceIDs), list(creq.must_include_deviceIDs), creq.allocation_size
            )
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:  # noqa: N802
        served: list[Served] = []
        # The follow-up (apiserver writes, bus) starts when the RPC is over: never ahead of the reply.
        context.add_done_callback(lambda _: self._follow_up(served))
        try:
            if not request.container_requests:
                raise InvalidInput("the request holds no container requests")
            answers = []
            for creq in request.container_requests:
                allocation, done = await self.allocator.allocate(list(creq.devices_ids))
                served.append(done)
                answers.append(to_pb(allocation.response))
            return pb.AllocateResponse(container_responses=answers)
        except HamiError as err:
            await _abort(context, "Allocate", err)

    def _follow_up(self, served: list[Served]) -> None:
        for done in served:
            self.allocator.follow_up(done)

    async def PreStartContainer(  # noqa: N802
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()  # pre_start_required is false: nothing to prepare
