"""The generated v1beta1 stubs (fresh, named as the kubelet expects) and the service's entry points."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from hami_allocator.main import main
from hami_allocator.service import serve
from hami_allocator.settings import AllocatorSettings
from hami_common.deviceplugin import generate
from hami_common.resources import GPU
from hami_sim.kubelet import KubeletEmulator


def test_generated_stubs_match_the_proto(tmp_path: Path) -> None:
    generate.generate(tmp_path)
    for name in generate.GENERATED:
        installed = generate.HERE / name
        assert installed.exists(), f"{name} missing: run python -m hami_common.deviceplugin.generate"
        assert installed.read_text() == (tmp_path / name).read_text(), (
            f"{name} is stale against {generate.PROTO.name}: run python -m hami_common.deviceplugin.generate"
        )


def test_wire_names_and_field_numbers_are_the_kubelets() -> None:
    from hami_common.deviceplugin.rpc import pb

    service = pb.DESCRIPTOR.services_by_name["DevicePlugin"]
    assert service.full_name == "v1beta1.DevicePlugin"
    assert [m.name for m in service.methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert pb.DESCRIPTOR.services_by_name["Registration"].full_name == "v1beta1.Registration"
    fields = {f.name: f.number for f in pb.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert fields == {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5}
    preferred = {f.name: f.number for f in pb.ContainerPreferredAllocationRequest.DESCRIPTOR.fields}
    assert preferred == {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3}
    assert {f.name: f.number for f in pb.Device.DESCRIPTOR.fields} == {"ID": 1, "health": 2, "topology": 3}


def test_help_lists_the_settings_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--plugin-dir" in out
    assert "HAMI_STAGING_DIR" in out


def test_missing_node_name_is_a_configuration_error() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--no-use-apiserver", "--no-use-bus"])
    assert exited.value.code == 2


async def test_service_body_serves_declared_gpus_until_stopped(sockdir: Path, tmp_path: Path) -> None:
    settings = AllocatorSettings(
        node_name="gpu-node-1",
        plugin_dir=str(sockdir),
        gpus=("GPU-aaa:0", "GPU-bbb:1"),
        device_split_count=3,
        staging_dir=str(tmp_path / "staging"),
        hook_path=str(tmp_path / "hook"),
        use_apiserver=False,
        use_bus=False,
        watch_interval=0.02,
        numa_topology=True,
    )
    stop = asyncio.Event()
    async with KubeletEmulator(sockdir) as kubelet:
        body = asyncio.create_task(serve(settings, stop))
        view = await kubelet.wait_devices(GPU, 6)
        stop.set()
        await body
    assert sorted(view.devices) == [f"GPU-{g}-{i}" for g in ("aaa", "bbb") for i in range(3)]


async def test_service_advertises_the_gpus_discovery_finds_and_follows_their_health(
    sockdir: Path, tmp_path: Path
) -> None:
    declared = tmp_path / "inventory.yaml"

    def declare(healthy: bool) -> None:
        gpu = {"uuid": "GPU-ccc", "index": 0, "model": "Tesla V100", "memory_mib": 32768, "healthy": healthy}
        text = yaml.safe_dump({"nodes": {"gpu-node-1": [gpu]}})
        staged = declared.with_suffix(".tmp")
        staged.write_text(text)
        staged.replace(declared)  # the reader never sees half a file

    await asyncio.to_thread(declare, True)
    settings = AllocatorSettings(
        node_name="gpu-node-1",
        plugin_dir=str(sockdir),
        inventory="fake",
        fake_inventory=str(declared),
        inventory_poll=0.02,
        device_split_count=2,
        staging_dir=str(tmp_path / "staging"),
        hook_path=str(tmp_path / "hook"),
        use_apiserver=False,
        use_bus=False,
        watch_interval=0.02,
    )
    stop = asyncio.Event()
    async with KubeletEmulator(sockdir) as kubelet:
        body = asyncio.create_task(serve(settings, stop))
        view = await kubelet.wait_devices(GPU, 2)
        await asyncio.to_thread(declare, False)
        await kubelet.wait_devices(GPU, 0)
        stop.set()
        await body
    assert sorted(view.devices) == ["GPU-ccc-0", "GPU-ccc-1"]


def test_discovery_and_declared_gpus_together_are_a_configuration_error(sockdir: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "--node-name",
                "n",
                "--plugin-dir",
                str(sockdir),
                "--inventory",
                "fake",
                "--gpus",
                "GPU-a",
                "--no-use-apiserver",
                "--no-use-bus",
            ]
        )
    assert exited.value.code == 2
