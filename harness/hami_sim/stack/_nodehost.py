"""Simulated nodes in a process of their own, as real nodes are separate machines.

With every node in the stack's process, the node agents, allocators and kubelet emulators took the interpreter
lock from the control plane they were measured against. A node host runs a shard of the nodes (kubelet
emulator, node agent, allocator each, and one pod watch handing bound pods to them) in a child process. The
parent sends the spec as the first line on the child's stdin, then commands (restart a node agent); the child
answers on stdout, one JSON message per line: ready, each admission with every Allocate answer, command
results, service failures. The child stops its nodes and exits when its stdin closes.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from hami_common.deviceplugin.rpc import pb
from hami_common.kube import KubeClient, KubeSettings, WatchCache, pod_source
from hami_sim.kubelet import ContainerAdmission, PodAdmission
from hami_sim.stack._config import StackConfig
from hami_sim.stack._node import Admitted, NodeConnections, SimNode, hand_over

__all__ = ["HostProcess", "HostSpec", "NodeHost"]

log = logging.getLogger(__name__)

_READY_TIMEOUT_S: Final = 120.0
_STOP_TIMEOUT_S: Final = 30.0
_THREADS: Final = 32


class HostSpec(msgspec.Struct, frozen=True, kw_only=True):
    config: dict[str, Any]  # StackConfig's fields, paths as strings
    nodes: list[str]
    nats_url: str
    kubeconfig: str
    kubelet_kubeconfig: str = ""


class HostCommand(msgspec.Struct, frozen=True, kw_only=True):
    op: Literal["restart_agent"]
    node: str


class ContainerWire(msgspec.Struct, frozen=True):
    name: str
    device_ids: list[str]
    response: bytes | None  # a serialized ContainerAllocateResponse
    error: str


class AdmittedWire(msgspec.Struct, frozen=True, tag="admitted"):
    node: str
    uid: str
    namespace: str
    name: str
    containers: list[ContainerWire]
    at: float  # time.monotonic(): one clock for every process of the machine


class ReadyWire(msgspec.Struct, frozen=True, tag="ready"):
    pass


class DoneWire(msgspec.Struct, frozen=True, tag="done"):
    op: str
    error: str = ""


class FailureWire(msgspec.Struct, frozen=True, tag="failure"):
    service: str
    error: str


HostMessage = AdmittedWire | ReadyWire | DoneWire | FailureWire


def config_fields(config: StackConfig) -> dict[str, Any]:
    return {
        name: str(value) if isinstance(value, Path) else value
        for name in StackConfig.__dataclass_fields__
        for value in (getattr(config, name),)
    }


def _config_from(fields: dict[str, Any]) -> StackConfig:
    device_config = fields.get("device_config_file")
    paths = {"workdir": Path(fields["workdir"]), "sockdir": Path(fields["sockdir"])}
    device_file = Path(device_config) if device_config else None
    vendors = tuple(fields.get("vendors", ()))
    return StackConfig(**{**fields, **paths, "device_config_file": device_file, "vendors": vendors})


def to_wire(admitted: Admitted) -> AdmittedWire:
    pod = admitted.admission
    containers = [
        ContainerWire(c.name, list(c.device_ids), c.response.SerializeToString() if c.response else None, c.error)
        for c in pod.containers
    ]
    return AdmittedWire(admitted.node, pod.uid, pod.namespace, pod.name, containers, admitted.at)


def from_wire(wire: AdmittedWire) -> Admitted:
    containers = tuple(
        ContainerAdmission(
            c.name,
            tuple(c.device_ids),
            pb.ContainerAllocateResponse.FromString(c.response) if c.response is not None else None,
            c.error,
        )
        for c in wire.containers
    )
    return Admitted(wire.node, PodAdmission(wire.uid, wire.namespace, wire.name, containers), wire.at)


class NodeHost:
    """The parent's handle on one node host: ``await start()``, ``await restart_agent(node)``, ``await stop()``."""

    def __init__(
        self,
        config: StackConfig,
        nodes: list[str],
        connections: NodeConnections,
        on_admitted: Callable[[Admitted], None],
    ) -> None:
        self.nodes = nodes
        self.failures: dict[str, list[str]] = {}  # service -> what failed it, as the child reported
        self._spec = HostSpec(
            config=config_fields(config),
            nodes=nodes,
            nats_url=connections.nats_url,
            kubeconfig=connections.kubeconfig,
            kubelet_kubeconfig=connections.kubelet_kubeconfig,
        )
        self._on_admitted = on_admitted
        self._child: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._done: asyncio.Queue[DoneWire] = asyncio.Queue()
        self._commands = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        return None if self._child is None or self._child.returncode is not None else self._child.pid

    async def start(self) -> None:
        self._child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hami_sim.stack._nodehost_child", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, limit=16 * 1024 * 1024,
        )  # fmt: skip
        assert self._child.stdin is not None
        self._child.stdin.write(msgspec.json.encode(self._spec) + b"\n")
        self._reader = asyncio.create_task(self._read(), name=f"node host {self.nodes[0]}…")
        ready = asyncio.create_task(self._ready.wait())
        try:
            async with asyncio.timeout(_READY_TIMEOUT_S):
                await asyncio.wait({ready, self._reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
        if not self._ready.is_set():
            raise RuntimeError(f"the node host of {self.nodes} exited before its nodes were ready")

    async def _read(self) -> None:
        assert self._child is not None
        assert self._child.stdout is not None
        decoder = msgspec.json.Decoder(HostMessage)
        async for line in self._child.stdout:
            try:
                message = decoder.decode(line)
            except msgspec.DecodeError as err:
                log.error("node host wrote a malformed line (%s): %r", err, line[:120])
                continue
            if isinstance(message, AdmittedWire):
                self._on_admitted(from_wire(message))
            elif isinstance(message, ReadyWire):
                self._ready.set()
            elif isinstance(message, DoneWire):
                self._done.put_nowait(message)
            else:
                self.failures.setdefault(message.service, []).append(message.error)

    async def restart_agent(self, node: str) -> None:
        async with self._commands:
            assert self._child is not None
            assert self._child.stdin is not None
            self._child.stdin.write(msgspec.json.encode(HostCommand(op="restart_agent", node=node)) + b"\n")
            done = await asyncio.wait_for(self._done.get(), _READY_TIMEOUT_S)
        if done.error:
            raise RuntimeError(f"restarting the node agent of {node}: {done.error}")

    async def stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if child.stdin is not None:
            child.stdin.close()
        try:
            await asyncio.wait_for(child.wait(), _STOP_TIMEOUT_S)
        except TimeoutError:
            log.error("node host of %s did not stop in %.0fs; killing it", self.nodes, _STOP_TIMEOUT_S)
            child.kill()
            await child.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


# --- the child ---------------------------------------------------------------------------------------------


class HostProcess:
    def __init__(self, spec: HostSpec, out: Callable[[msgspec.Struct], None]) -> None:
        self.spec = spec
        self.config = _config_from(spec.config)
        self.out = out
        self.nodes: dict[str, SimNode] = {}

    def _admitted(self, admitted: Admitted) -> None:
        self.out(to_wire(admitted))

    def _failed(self, service: str, err: BaseException) -> None:
        self.out(FailureWire(service, repr(err)))

    async def _command(self, line: bytes) -> None:
        try:
            command = msgspec.json.decode(line, type=HostCommand)
        except msgspec.DecodeError as err:
            log.error("malformed command from the stack: %s", err)
            self.out(DoneWire(op="?", error=f"malformed command: {err}"))
            return
        node = self.nodes.get(command.node)
        if node is None:
            self.out(DoneWire(op=command.op, error=f"no node {command.node} here"))
            return
        await node.agent.restart()
        self.out(DoneWire(op=command.op))

    async def run(self, commands: asyncio.StreamReader) -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(_THREADS, thread_name_prefix="node"))
        connections = NodeConnections(
            nats_url=self.spec.nats_url,
            kubeconfig=self.spec.kubeconfig,
            kubelet_kubeconfig=self.spec.kubelet_kubeconfig,
        )
        settings = KubeSettings(kubeconfig=connections.kubelet, kube_backoff_initial=0.05, kube_backoff_max=1.0)
        async with KubeClient.from_settings(settings) as kube, asyncio.TaskGroup() as tasks:
            for name in self.spec.nodes:
                node = SimNode(name, self.config, connections, tasks, self._admitted, kube, self._failed)
                self.nodes[name] = node
                await node.start()
            cache = WatchCache(pod_source(kube), name="kubelet pods")
            cache.add_handler(lambda change: hand_over(self.nodes, change))
            watching = tasks.create_task(cache.run(), name="kubelet pod watch")
            async with asyncio.timeout(_READY_TIMEOUT_S):
                await asyncio.gather(*(node.wait_ready() for node in self.nodes.values()))
            self.out(ReadyWire())
            async for line in commands:
                await self._command(line)
            watching.cancel()
            await asyncio.gather(*(node.stop() for node in self.nodes.values()))
