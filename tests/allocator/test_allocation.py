"""The Allocate answer built from a placement or an annotation (hami-protocol §5.4, §9 item 10)."""

from __future__ import annotations

import pytest

from hami_common import envvars
from hami_common.allocation import (
    LIMITS_CONTAINER_PATH,
    ContainerGrant,
    GrantedDevice,
    NodeAllocationConfig,
    build_container,
    build_pod,
    from_annotation,
    from_placement,
    is_true,
    task_priority,
)
from hami_common.annotations import decode_pod_devices
from hami_common.errors import InvalidInput
from hami_common.events import ContainerPlacement, PlacedDevice, PlacementDecision

UID = "0f1e2d3c-aaaa-bbbb-cccc-000000000001"
CONFIG = NodeAllocationConfig()


def grant(*devices: tuple[str, int, int], name: str = "main", **kw: object) -> ContainerGrant:
    return ContainerGrant(name=name, devices=tuple(GrantedDevice(*d) for d in devices), **kw)  # type: ignore[arg-type]


def test_one_device_gets_hamis_environment() -> None:
    answer = build_container(UID, grant(("GPU-aaa", 3000, 50)), CONFIG)
    envs = answer.response.envs
    assert envs[envvars.NVIDIA_VISIBLE_DEVICES] == "GPU-aaa"
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert envs[envvars.CUDA_DEVICE_SM_LIMIT] == "50"
    assert envs[envvars.CUDA_DEVICE_MEMORY_SHARED_CACHE].startswith("/usr/local/vgpu/")
    assert envs[envvars.CUDA_DEVICE_MEMORY_SHARED_CACHE].endswith(".cache")
    assert envvars.CUDA_OVERSUBSCRIBE not in envs
    assert envvars.GPU_CORE_UTILIZATION_POLICY not in envs


def test_two_devices_get_one_memory_limit_each_and_sm_limit_of_the_first() -> None:
    answer = build_container(UID, grant(("GPU-aaa", 1000, 30), ("GPU-bbb", 2000, 70)), CONFIG)
    envs = answer.response.envs
    assert envs[envvars.NVIDIA_VISIBLE_DEVICES] == "GPU-aaa,GPU-bbb"
    assert (envs["CUDA_DEVICE_MEMORY_LIMIT_0"], envs["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("1000m", "2000m")
    assert envs[envvars.CUDA_DEVICE_SM_LIMIT] == "30"
    assert answer.device_uuids == ("GPU-aaa", "GPU-bbb")


def test_mounts_libvgpu_cache_dir_lock_preload_and_limits_file() -> None:
    answer = build_container(UID, grant(("GPU-aaa", 3000, 50), name="train"), CONFIG)
    mounts = {m.container_path: m for m in answer.response.mounts}
    assert mounts["/usr/local/vgpu/libvgpu.so"].read_only
    assert mounts["/usr/local/vgpu"].host_path == f"/usr/local/vgpu/containers/{UID}_train"
    assert not mounts["/usr/local/vgpu"].read_only
    assert mounts["/tmp/vgpulock"].host_path == "/tmp/vgpulock"
    assert mounts["/etc/ld.so.preload"].host_path == "/usr/local/vgpu/ld.so.preload"
    limits = mounts[LIMITS_CONTAINER_PATH]
    assert limits.read_only
    assert limits.host_path == answer.limits_host_path
    assert not limits.host_path.startswith(answer.cache_dir)  # the container cannot rewrite its own limits


def test_limits_file_repeats_the_environment_as_key_value_lines() -> None:
    answer = build_container(UID, grant(("GPU-aaa", 3000, 50), priority=0), CONFIG)
    lines = dict(line.split("=", 1) for line in answer.limits_content.splitlines())
    envs = answer.response.envs
    assert lines.items() >= {(k, v) for k, v in envs.items() if k != envvars.NVIDIA_VISIBLE_DEVICES}
    assert lines[envvars.CUDA_TASK_PRIORITY] == "0"
    assert task_priority(answer.limits_content) == 0


@pytest.mark.parametrize(
    ("config", "policy"),
    [
        pytest.param(CONFIG, "default", id="a node without a core policy pins default in the file"),
        pytest.param(NodeAllocationConfig(core_policy="force"), "force", id="the node's force policy is pinned"),
        pytest.param(NodeAllocationConfig(disable_core_limit=True), "disable", id="a disabled core limit is pinned"),
    ],
)
def test_limits_file_pins_policy_and_priority_the_environment_leaves_unset(
    config: NodeAllocationConfig, policy: str
) -> None:
    answer = build_container(UID, grant(("GPU-aaa", 3000, 10)), config)
    lines = dict(line.split("=", 1) for line in answer.limits_content.splitlines())
    assert lines[envvars.GPU_CORE_UTILIZATION_POLICY] == policy
    assert lines[envvars.CUDA_TASK_PRIORITY] == "1"
    assert envvars.CUDA_TASK_PRIORITY not in answer.response.envs  # the env stays HAMi's


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param("CUDA_TASK_PRIORITY=0\n", 0, id="the written priority"),
        pytest.param(" CUDA_TASK_PRIORITY = 0 \nCUDA_TASK_PRIORITY=1\n", 1, id="trimmed, the last one wins"),
        pytest.param("CUDA_DEVICE_SM_LIMIT=10\n", 1, id="absent means the default"),
        pytest.param("CUDA_TASK_PRIORITY=1_0\n", 1, id="not an integer means the default"),
        pytest.param("CUDA_TASK_PRIORITY=-99999999999\n", 1, id="outside int means the default"),
    ],
)
def test_task_priority_is_read_back_as_the_interposer_reads_it(content: str, expected: int) -> None:
    assert task_priority(content) == expected


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        pytest.param(NodeAllocationConfig(core_policy="force"), "force", id="force core policy is passed on"),
        pytest.param(NodeAllocationConfig(core_policy="default"), None, id="default core policy sets nothing"),
        pytest.param(NodeAllocationConfig(disable_core_limit=True), "disable", id="disabled core limit wins"),
    ],
)
def test_core_utilization_policy(config: NodeAllocationConfig, expected: str | None) -> None:
    envs = build_container(UID, grant(("GPU-aaa", 1, 1)), config).response.envs
    assert envs.get(envvars.GPU_CORE_UTILIZATION_POLICY) == expected


def test_memory_scaling_above_one_oversubscribes_and_log_level_is_passed() -> None:
    config = NodeAllocationConfig(device_memory_scaling=1.5, libcuda_log_level="1", cdi_kind="nvidia.com/gpu")
    answer = build_container(UID, grant(("GPU-aaa", 1, 1)), config)
    assert answer.response.envs[envvars.CUDA_OVERSUBSCRIBE] == "true"
    assert answer.response.envs[envvars.LIBCUDA_LOG_LEVEL] == "1"
    assert answer.response.cdi_devices == ("nvidia.com/gpu=GPU-aaa",)


def test_disable_control_drops_the_preload_mount_only() -> None:
    answer = build_container(UID, grant(("GPU-aaa", 1, 1), disable_control=True), CONFIG)
    paths = [m.container_path for m in answer.response.mounts]
    assert "/etc/ld.so.preload" not in paths
    assert LIMITS_CONTAINER_PATH in paths


@pytest.mark.parametrize("word", ["true", "TRUE", "1", "t"])
def test_disable_control_reads_go_booleans(word: str) -> None:
    assert is_true(word)


def test_same_container_always_gets_the_same_cache_file() -> None:
    one = build_container(UID, grant(("GPU-aaa", 1, 1)), CONFIG)
    two = build_container(UID, grant(("GPU-aaa", 1, 1)), CONFIG)
    other = build_container(UID, grant(("GPU-aaa", 1, 1), name="side"), CONFIG)
    key = envvars.CUDA_DEVICE_MEMORY_SHARED_CACHE
    assert one.response.envs[key] == two.response.envs[key] != other.response.envs[key]


@pytest.mark.parametrize("bad", ["../etc", "a/b", "", ".hidden"])
def test_names_that_could_escape_the_hook_dir_are_rejected(bad: str) -> None:
    with pytest.raises(InvalidInput):
        build_container(bad, grant(("GPU-aaa", 1, 1)), CONFIG)


def test_placement_and_annotation_give_the_same_answers() -> None:
    decision = PlacementDecision(
        pod_uid=UID,
        namespace="ns",
        name="p",
        node="n1",
        bind_time_ns=1,
        containers=(
            ContainerPlacement(name="init", init=True),
            ContainerPlacement(
                name="a", devices=(PlacedDevice(uuid="GPU-a", type="NVIDIA", usedmem_mib=3000, usedcores=0),)
            ),
            ContainerPlacement(
                name="b", devices=(PlacedDevice(uuid="GPU-a", type="NVIDIA", usedmem_mib=5000, usedcores=0),)
            ),
        ),
    )
    annotated = from_annotation(
        pod_uid=UID,
        namespace="ns",
        name="p",
        container_names=["init", "a", "b"],
        devices=decode_pod_devices(";GPU-a,NVIDIA,3000,0:;GPU-a,NVIDIA,5000,0:;"),
    )
    staged = build_pod(from_placement(decision), CONFIG)
    assert [c.name for c in staged] == ["a", "b"]  # the kubelet never asks for a GPU-less container
    assert staged == build_pod(annotated, CONFIG)


def test_annotation_with_more_devices_than_containers_is_rejected() -> None:
    with pytest.raises(InvalidInput, match="more than its 1 containers"):
        from_annotation(
            pod_uid=UID,
            namespace="ns",
            name="p",
            container_names=["a"],
            devices=decode_pod_devices("GPU-a,NVIDIA,1,0:;GPU-b,NVIDIA,1,0:;"),
        )
