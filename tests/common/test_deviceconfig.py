"""HAMi's device-config.yaml as it is (issue 18.1): the chart's file loads unchanged, bad keys are named,
flags win over the file, and every service takes the same values from it."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from hami_allocator.settings import AllocatorSettings
from hami_common.deviceconfig import DeviceConfig, parse_device_config, read_device_config
from hami_common.errors import InvalidInput
from hami_common.inventory import NodeDeviceConfig
from hami_common.resources import ContainerResources, ResourceConfig, container_request
from hami_common.settings import load
from hami_extender.settings import ExtenderSettings
from hami_nodeagent.settings import NodeAgentSettings
from hami_webhook.main import main as webhook_main
from hami_webhook.settings import WebhookSettings

CHART = Path(__file__).parent / "fixtures" / "hami-device-config.yaml"
NODE = "gpu-node-0"


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "device-config.yaml"
    path.write_text(text)
    return str(path)


def test_chart_default_device_config_loads_with_the_defaults_we_use_without_it() -> None:
    config = read_device_config(CHART)
    assert config.resources == ResourceConfig()
    # libCudaLogLevel: 1 is the chart's value and reaches containers as LIBCUDA_LOG_LEVEL=1, as in HAMi
    # the chart's migProfileAllowlist reaches every node's services with the rest of the node defaults
    assert config.node_defaults == NodeDeviceConfig(libcuda_log_level="1", mig_allowlist=config.mig_profile_allowlist)
    assert (config.overwrite_env, config.gpu_core_policy, config.runtime_class_name) == (False, "default", "")
    assert config.mig_profile_allowlist[0].models == ("A30",)
    # the chart renders the Cambricon and Hygon sections, which enables them as in HAMi; Ascend waits for
    # its own switch (HAMi's --enable-ascend); the vendors not implemented here are listed as ignored
    assert [family.word for family in config.families] == ["MLU", "DCU"]
    assert "metax" in config.ignored_sections
    assert not {"vnpus", "cambricon", "hygon"} & set(config.ignored_sections)


def test_services_given_the_chart_file_behave_as_without_it() -> None:
    chart = str(CHART)
    # the chart's cambricon and hygon sections enable those families (checked above); NVIDIA's rules are as without
    with_chart = WebhookSettings(device_config_file=chart).policy()
    assert dataclasses.replace(with_chart, families=()) == WebhookSettings().policy()
    assert ExtenderSettings(device_config_file=chart).resource_config() == ExtenderSettings().resource_config()
    assert ExtenderSettings(device_config_file=chart).policies() == ExtenderSettings().policies()
    with_file = AllocatorSettings(node_name=NODE, device_config_file=chart)
    without = AllocatorSettings(node_name=NODE)
    assert with_file.advertised_resource() == without.advertised_resource() == "nvidia.com/gpu"
    allowlist = with_file.device_config().mig_profile_allowlist
    assert with_file.node_config() == NodeDeviceConfig(libcuda_log_level="1", mig_allowlist=allowlist)
    assert without.node_config() == NodeDeviceConfig()
    agent = NodeAgentSettings(node_name=NODE, inventory="fake", device_config_file=chart)
    assert agent.node_config() == with_file.node_config()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        pytest.param("nvidia:\n  deviceSplitCout: 3\n", "deviceSplitCout", id="a misspelt nvidia key is named"),
        pytest.param("nvidia:\n  deviceSplitCount: three\n", "nvidia.deviceSplitCount", id="a count that is text"),
        pytest.param("nvidia:\n  memoryFactor: 0\n", "nvidia.memoryFactor", id="a zero memory factor"),
        pytest.param("nvidia:\n  defaultCores: 150\n", "nvidia.defaultCores", id="default cores above 100"),
        pytest.param("nvidia:\n  gpuCorePolicy: strict\n", "nvidia.gpuCorePolicy", id="an unknown core policy"),
        pytest.param("nvidia:\n  resourceCoreName: cores\n", "nvidia.resourceCoreName", id="a name without domain"),
        pytest.param("nvidia:\n  resourceCoreName: nvidia.com/gpu\n", "share a name", id="two resources with one name"),
        pytest.param(
            "nvidia:\n  migProfileAllowlist:\n  - models: [A30]\n    profiles: [big]\n",
            "migProfileAllowlist[0]",
            id="a MIG profile not shaped <N>g.<memory>",
        ),
        pytest.param("nvdia:\n  deviceSplitCount: 3\n", "nvdia", id="a misspelt section"),
        pytest.param("nodeconfig:\n- name: a\n  splitcount: 3\n", "splitcount", id="an unknown nodeconfig key"),
        pytest.param("nodeconfig:\n- name: a\n  operatingmode: mps\n", "'a'", id="an unknown operating mode"),
        pytest.param("nodeconfig:\n- name: a\n  migstrategy: all\n", "migstrategy", id="an unknown MIG strategy"),
        pytest.param("nodeconfig:\n- name: a\n  libcudaloglevel: 9\n", "log level", id="a log level past 4"),
        pytest.param("nodeconfig:\n- name: a\n- name: a\n", "two entries", id="a node listed twice"),
        pytest.param("nvidia: [1, 2]\n", "nvidia", id="a section that is a list"),
        pytest.param("nvidia: {\n", "not YAML", id="text that is not YAML"),
    ],
)
def test_bad_device_config_is_refused_naming_the_key(text: str, named: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_device_config(text)
    assert named in str(caught.value)


def test_renamed_resources_and_knobs_reach_every_service(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        "nvidia:\n  resourceCountName: nvidia.com/vgpu\n  resourceCoreName: nvidia.com/cores\n"
        "  resourceMemoryName: nvidia.com/vmem\n  memoryFactor: 2\n  defaultCores: 20\n  deviceSplitCount: 4\n"
        "  gpuCorePolicy: force\n",
    )
    policy = WebhookSettings(device_config_file=path).policy()
    assert (policy.resources.count_name, policy.resources.core_name) == ("nvidia.com/vgpu", "nvidia.com/cores")
    assert policy.gpu_core_policy == "force"
    resources = ExtenderSettings(device_config_file=path).resource_config()
    request = container_request(
        ContainerResources("c", limits={"nvidia.com/vgpu": "1", "nvidia.com/vmem": "1000"}), resources
    )
    assert request is not None
    assert (request.memreq, request.coresreq) == (2000, 20)
    allocator = AllocatorSettings(node_name=NODE, device_config_file=path)
    assert allocator.advertised_resource() == "nvidia.com/vgpu"
    assert allocator.node_config().split_count == 4
    assert allocator.allocation_config(allocator.node_config()).core_policy == "force"


def test_flags_given_win_over_the_file(tmp_path: Path) -> None:
    path = _file(tmp_path, "nvidia:\n  memoryFactor: 2\n  deviceSplitCount: 4\n  overwriteEnv: true\n")
    assert ExtenderSettings(device_config_file=path).resource_config().memory_factor == 2
    given = load(ExtenderSettings, ["--device-config-file", path, "--memory-factor", "1"], env={})
    assert given.resource_config().memory_factor == 1
    assert load(WebhookSettings, ["--device-config-file", path], env={}).policy().overwrite_env is True
    off = load(WebhookSettings, ["--device-config-file", path, "--no-overwrite-env"], env={})
    assert off.policy().overwrite_env is False
    split = load(
        AllocatorSettings, ["--device-config-file", path, "--node-name", NODE, "--device-split-count", "10"], env={}
    )
    assert split.node_config().split_count == 10


def test_other_vendor_sections_are_accepted_with_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="hami_common.deviceconfig"):
        WebhookSettings(device_config_file=str(CHART))
    lines = [r.getMessage() for r in caplog.records if r.name == "hami_common.deviceconfig"]
    assert len(lines) == 1
    assert "metax" in lines[0]
    assert "vnpus" not in lines[0]
    assert "not applied" in lines[0]


def test_a_bad_device_config_stops_the_service_at_start_with_exit_2(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _file(tmp_path, "nvidia:\n  deviceSplitCout: 3\n")
    assert webhook_main(["--device-config-file", path]) == 2
    assert any("deviceSplitCout" in r.getMessage() for r in caplog.records)


def test_an_empty_device_config_is_hamis_defaults() -> None:
    assert parse_device_config("") == DeviceConfig()
