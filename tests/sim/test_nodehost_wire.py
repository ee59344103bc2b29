"""The node host's line protocol: admissions cross the process boundary intact; bad commands get an answer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec

from hami_common.deviceplugin.rpc import pb
from hami_sim.kubelet import ContainerAdmission, PodAdmission
from hami_sim.stack import Admitted, StackConfig
from hami_sim.stack._nodehost import (
    DoneWire,
    FailureWire,
    HostMessage,
    HostProcess,
    HostSpec,
    config_fields,
    from_wire,
    to_wire,
)
from hami_sim.stack._service import RunningService


def test_an_admission_survives_the_round_trip_with_its_allocate_answers() -> None:
    response = pb.ContainerAllocateResponse(envs={"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m"})
    response.mounts.add(container_path="/etc/ld.so.preload", host_path="/hook/ld.so.preload", read_only=True)
    admitted = Admitted(
        "gpu-node-3",
        PodAdmission(
            "uid-1", "team-a", "train",
            (ContainerAdmission("cuda", ("GPU-a-0", "GPU-a-1"), response), ContainerAdmission("log", (), None, "boom")),
        ),
        123.5,
    )  # fmt: skip
    line = msgspec.json.encode(to_wire(admitted))
    back = from_wire(msgspec.json.decode(line, type=HostMessage))  # type: ignore[arg-type]
    assert back == admitted
    assert back.admission.container("cuda").envs == {"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m"}


def test_config_fields_rebuild_the_same_config(tmp_path: Path) -> None:
    config = StackConfig(workdir=tmp_path / "w", sockdir=tmp_path / "s", nodes=7, node_hosts=2)
    spec = HostSpec(config=config_fields(config), nodes=["gpu-node-0"], nats_url="nats://x", kubeconfig="k")
    decoded = msgspec.json.decode(msgspec.json.encode(spec), type=HostSpec)
    assert HostProcess(decoded, lambda _: None).config == config


async def test_malformed_and_unknown_commands_are_answered_with_an_error(tmp_path: Path) -> None:
    config = StackConfig(workdir=tmp_path, sockdir=tmp_path)
    answers: list[msgspec.Struct] = []
    spec = HostSpec(config=config_fields(config), nodes=[], nats_url="nats://x", kubeconfig="k")
    host = HostProcess(spec, answers.append)
    for line in (b"not json\n", b'{"op": "explode", "node": "n"}\n', b'{"op": "restart_agent", "node": "nowhere"}\n'):
        await host._command(line)
    assert all(isinstance(a, DoneWire) and a.error for a in answers)
    assert "malformed command" in str(answers[0])
    assert "no node nowhere here" in str(answers[2])


async def test_a_failing_node_service_is_reported_as_it_fails(tmp_path: Path) -> None:
    """A service body that fails is logged, kept out of the others' way and reported through the hook at once."""
    config = StackConfig(workdir=tmp_path, sockdir=tmp_path)
    lines: list[msgspec.Struct] = []
    host = HostProcess(HostSpec(config=config_fields(config), nodes=[], nats_url="n", kubeconfig="k"), lines.append)

    async def broken(stop: asyncio.Event) -> None:
        raise RuntimeError("inventory unreadable")

    async with asyncio.TaskGroup() as tasks:
        service = RunningService("nodeagent/gpu-node-0", broken, tasks, host._failed)
        service.start()
    assert [type(line).__name__ for line in lines] == ["FailureWire"]
    decoded = msgspec.json.decode(msgspec.json.encode(lines[0]), type=HostMessage)
    assert isinstance(decoded, FailureWire)
    assert (decoded.service, decoded.error) == ("nodeagent/gpu-node-0", "RuntimeError('inventory unreadable')")
