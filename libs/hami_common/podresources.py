"""The kubelet's PodResources API (``v1.PodResourcesLister``): which devices each pod's containers hold.

The device plugin API never says which pod an ``Allocate`` is for; the kubelet's PodResources socket says
which pods it runs and which device IDs each container already holds, which is how the allocator tells the
pod being admitted (:mod:`hami_allocator.admitting`). Only ``List`` is used, and only the fields that name
pods, containers and their device IDs: the message types are built here from those field numbers
(``k8s.io/kubelet/pkg/apis/podresources/v1``), so no generated code is needed and the fields this module does
not declare (CPU ids, memory, topology, dynamic resources) are skipped when a reply is read. The kubelet
emulator serves the same messages (:func:`add_lister`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import grpc
import msgspec
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from hami_common.deviceplugin.rpc import unix_target

__all__ = [
    "DEFAULT_SOCKET",
    "LIST_METHOD",
    "ListedContainer",
    "ListedPod",
    "PodResourcesClient",
    "add_lister",
]

DEFAULT_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
_SERVICE: Final = "v1.PodResourcesLister"
LIST_METHOD: Final = f"/{_SERVICE}/List"

_T = descriptor_pb2.FieldDescriptorProto


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="hami_podresources_v1.proto", package="v1", syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            f = m.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                f.type_name = type_name

    one, many = _T.LABEL_OPTIONAL, _T.LABEL_REPEATED
    text, sub = _T.TYPE_STRING, _T.TYPE_MESSAGE
    message("ListPodResourcesRequest")
    message("ListPodResourcesResponse", ("pod_resources", 1, sub, many, ".v1.PodResources"))
    message(
        "PodResources",
        ("name", 1, text, one, ""),
        ("namespace", 2, text, one, ""),
        ("containers", 3, sub, many, ".v1.ContainerResources"),
    )
    message("ContainerResources", ("name", 1, text, one, ""), ("devices", 2, sub, many, ".v1.ContainerDevices"))
    message("ContainerDevices", ("resource_name", 1, text, one, ""), ("device_ids", 2, text, many, ""))
    return proto


_POOL: Final = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
_LIST_REQUEST: Any = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("v1.ListPodResourcesRequest"))
_LIST_RESPONSE: Any = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("v1.ListPodResourcesResponse"))


class ListedContainer(msgspec.Struct, frozen=True):
    name: str
    devices: dict[str, tuple[str, ...]] = {}  # device IDs by resource name


class ListedPod(msgspec.Struct, frozen=True):
    namespace: str
    name: str
    containers: tuple[ListedContainer, ...] = ()


def _decode(raw: bytes) -> Any:
    """The reply, or None when it does not decode (gRPC would log a traceback of its own; :meth:`list` raises)."""
    try:
        return _LIST_RESPONSE.FromString(raw)
    except DecodeError:
        return None


def _read(reply: Any) -> list[ListedPod]:
    pods = []
    for pod in reply.pod_resources:
        containers = []
        for container in pod.containers:
            devices: dict[str, tuple[str, ...]] = {}
            for held in container.devices:
                devices[held.resource_name] = (*devices.get(held.resource_name, ()), *held.device_ids)
            containers.append(ListedContainer(container.name, devices))
        pods.append(ListedPod(pod.namespace, pod.name, tuple(containers)))
    return pods


def _write(pods: Sequence[ListedPod]) -> Any:
    reply = _LIST_RESPONSE()
    for pod in pods:
        out = reply.pod_resources.add(name=pod.name, namespace=pod.namespace)
        for container in pod.containers:
            c = out.containers.add(name=container.name)
            for resource, ids in container.devices.items():
                c.devices.add(resource_name=resource, device_ids=list(ids))
    return reply


class PodResourcesClient:
    """``List`` on the kubelet's PodResources socket, with a deadline on every call."""

    def __init__(self, socket: str, timeout: float = 2.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self._channel: grpc.aio.Channel | None = None

    async def list(self) -> list[ListedPod]:
        """Raises ``grpc.aio.AioRpcError`` (unreachable, deadline) or ``DecodeError`` (a reply that is not one)."""
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(unix_target(self.socket))
        call = self._channel.unary_unary(
            LIST_METHOD,
            request_serializer=_LIST_REQUEST.SerializeToString,
            response_deserializer=_decode,
        )
        reply = await call(_LIST_REQUEST(), timeout=self.timeout)
        if reply is None:
            raise DecodeError("the kubelet's List reply is no ListPodResourcesResponse")
        return _read(reply)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


def add_lister(server: grpc.aio.Server, pods: Callable[[], Awaitable[Sequence[ListedPod]]]) -> None:
    """Serve ``List`` from ``pods`` on ``server`` (the kubelet emulator's PodResources socket)."""

    async def list_pods(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return _write(await pods())

    handler = grpc.unary_unary_rpc_method_handler(
        list_pods, request_deserializer=_LIST_REQUEST.FromString, response_serializer=lambda r: r.SerializeToString()
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {"List": handler}),))
