"""HAMi's older and newer device configs (issue 31 item 6): the chart's whole file of v2.9 (``knownMigGeometries``)
and of v2.10 load through the entry point the services use, with the chart's values; a key we do not read is
accepted with one warning, a misspelt one is refused, and no input makes the parser fail other than by naming
what is wrong."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_allocator.settings import AllocatorSettings
from hami_common.deviceconfig import DeviceConfig, parse_device_config, read_device_config
from hami_common.errors import InvalidInput
from hami_common.inventory import MigAllowlist, NodeDeviceConfig, allowed_mig_profiles, mig_card
from hami_common.resources import ResourceConfig
from hami_common.settings import load
from hami_common.vendors.ascend.config import CHART_CHIPS
from hami_extender.settings import ExtenderSettings
from hami_nodeagent.settings import NodeAgentSettings
from hami_sim.waiting import eventually_sync
from hami_webhook.settings import WebhookSettings

FIXTURES = Path(__file__).parent / "fixtures"
V2_9 = FIXTURES / "hami-chart-v2.9-device-config.yaml"
V2_10 = FIXTURES / "hami-chart-v2.10-device-config.yaml"
NODE = "gpu-node-0"

# The chart's entries for the three models its v2.9 geometries name; v2.10's allowlist has the same profiles.
OLD_MODELS_ALLOWLIST = (
    MigAllowlist(models=("A30",), profiles=("1g.6gb", "2g.12gb", "4g.24gb")),
    MigAllowlist(
        models=("A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB", "A100-SXM4-40GB"),
        profiles=("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"),
    ),
    MigAllowlist(
        models=("A100-SXM4-80GB", "A100-80GB-PCIe", "A100-PCIE-80GB"),
        profiles=("1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb"),
    ),
)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "hami_common.deviceconfig" and r.levelno == logging.WARNING
    ]


@pytest.mark.parametrize("fixture", [V2_9, V2_10], ids=["chart v2.9", "chart v2.10"])
def test_the_charts_whole_file_loads_with_the_charts_nvidia_values(fixture: Path) -> None:
    config = read_device_config(fixture)
    assert config.resources == ResourceConfig()  # names, defaultMemory 0, defaultCores 0, defaultGPUNum 1, factor 1
    assert config.node_defaults == NodeDeviceConfig(
        split_count=10,
        memory_scaling=1.0,
        core_scaling=1.0,
        preconfigured_memory_mib=0,
        libcuda_log_level="1",
        numa_topology=False,
        mig_allowlist=config.mig_profile_allowlist,
    )
    assert (config.overwrite_env, config.gpu_core_policy, config.runtime_class_name) == (False, "default", "")
    # v2.9's geometries for A30, A100-40GB and A100-80GB come out as v2.10's allowlist entries for those models
    first = config.mig_profile_allowlist[:3]
    assert [(set(e.models), e.profiles) for e in first] == [(set(e.models), e.profiles) for e in OLD_MODELS_ALLOWLIST]
    assert len(config.mig_profile_allowlist) == (3 if fixture == V2_9 else 9)


@pytest.mark.parametrize("fixture", [V2_9, V2_10], ids=["chart v2.9", "chart v2.10"])
def test_the_charts_vendor_sections_enable_cambricon_and_hygon_and_describe_ascend(fixture: Path) -> None:
    config = read_device_config(fixture)
    families = {family.word: family for family in config.families}
    assert list(families) == ["MLU", "DCU"]
    assert families["MLU"].resource_names == (
        "cambricon.com/vmlu",
        "cambricon.com/mlu.smlu.vmemory",
        "cambricon.com/mlu.smlu.vcore",
    )
    assert families["DCU"].resource_names == ("hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores")
    assert config.ignored_sections == (
        "amd", "awsneuron", "biren", "enflame", "iluvatars", "kunlun", "metax", "mthreads", "vastai",
    )  # fmt: skip
    # Ascend waits for its switch (HAMi's --enable-ascend); switched on, the chart's seven chips are the families
    raw = yaml.safe_load(fixture.read_text())
    raw["vnpus"]["enabled"] = True
    ascend = parse_device_config(yaml.safe_dump(raw))
    words = [family.word for family in ascend.families]
    assert words == [*(chip.common_word for chip in CHART_CHIPS), "MLU", "DCU"]
    b3 = next(family for family in ascend.families if family.word == "Ascend910B3")
    assert b3.resource_names == (
        "huawei.com/Ascend910B3",
        "huawei.com/Ascend910B3-memory",
        "huawei.com/Ascend910B3-core",
    )


def test_v2_9s_mig_geometries_restrict_as_they_did_rather_than_being_dropped() -> None:
    config = read_device_config(V2_9)
    assert config.mig_profile_allowlist == OLD_MODELS_ALLOWLIST
    card = mig_card("NVIDIA A100-SXM4-40GB")
    assert card is not None
    offered = [p.name for p in card.hami_profiles()]
    assert {"4g.20gb", "1g.10gb"} <= set(offered)  # what dropping the key would have let through
    allowed = allowed_mig_profiles(config.mig_profile_allowlist, "NVIDIA A100-SXM4-40GB", card.hami_profiles())
    assert [p.name for p in allowed] == ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]


def test_each_key_not_read_as_written_warns_once_per_load(caplog: pytest.LogCaptureFixture) -> None:
    assert len(read_device_config(V2_9).warnings) == 1
    assert read_device_config(V2_10).warnings == ()
    with caplog.at_level(logging.WARNING, logger="hami_common.deviceconfig"):
        WebhookSettings(device_config_file=str(V2_9))
    (line,) = _warnings(caplog)
    assert "nvidia.knownMigGeometries" in line
    assert "read as migProfileAllowlist" in line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hami_common.deviceconfig"):
        WebhookSettings(device_config_file=str(V2_10))
    assert _warnings(caplog) == []


def test_every_service_loads_its_settings_from_the_v2_9_file() -> None:
    path = str(V2_9)
    webhook = load(WebhookSettings, ["--device-config-file", path], env={})
    assert webhook.policy().resources == ResourceConfig()
    assert load(ExtenderSettings, ["--device-config-file", path], env={}).resource_config() == ResourceConfig()
    allocator = load(AllocatorSettings, ["--device-config-file", path, "--node-name", NODE], env={})
    assert allocator.node_config().mig_allowlist == OLD_MODELS_ALLOWLIST
    agent = load(NodeAgentSettings, ["--device-config-file", path, "--node-name", NODE, "--inventory", "fake"], env={})
    assert agent.node_config() == allocator.node_config()


def test_the_webhook_process_started_with_the_v2_9_file_serves_and_warns_once() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable, "-c", "import sys; from hami_webhook.main import main; sys.exit(main(sys.argv[1:]))",
        "--host", "127.0.0.1", "--port", str(port), "--no-watch-cluster", "--no-publish-events",
        "--device-config-file", str(V2_9),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with httpx.Client() as http:

            def up() -> bool:
                assert process.poll() is None, process.communicate()[0].decode()
                try:
                    return http.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
                except httpx.TransportError:
                    return False

            eventually_sync(up, what="hami-webhook listening with the v2.9 device config")
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=30)[0].decode()
    assert process.returncode == 0, output
    assert output.count("knownMigGeometries") == 1, output


@pytest.mark.parametrize(
    ("text", "warned"),
    [
        pytest.param("nvidia:\n  deviceClassName: x\n", "nvidia.deviceClassName", id="a newer HAMi nvidia key"),
        pytest.param("sophgo:\n  resourceCountName: x\n", "sophgo", id="a section of a vendor HAMi added later"),
        pytest.param(
            "nvidia:\n  knownMigGeometries: []\n", "nvidia.knownMigGeometries", id="empty geometries restrict nothing"
        ),
        pytest.param(
            "nvidia:\n  migProfileAllowlist:\n  - models: [A30]\n    profiles: [1g.6gb]\n"
            "  knownMigGeometries:\n  - models: [A30]\n    allowedGeometries: [[{name: 4g.24gb}]]\n",
            "migProfileAllowlist is given and wins",
            id="geometries beside an allowlist",
        ),
    ],
)
def test_a_key_we_do_not_read_is_accepted_with_one_warning_naming_it(text: str, warned: str) -> None:
    config = parse_device_config(text)
    (warning,) = config.warnings
    assert warned in warning
    assert config.resources == ResourceConfig()
    assert config.node_defaults.split_count == 10
    assert config.mig_profile_allowlist in ((), (MigAllowlist(models=("A30",), profiles=("1g.6gb",)),))


@pytest.mark.parametrize(
    ("text", "named"),
    [
        pytest.param("nvidia:\n  devicesplitcount: 3\n", "did you mean nvidia.deviceSplitCount", id="other case"),
        pytest.param("nvidia:\n  splitCount: 3\n", "did you mean nvidia.deviceSplitCount", id="part of a key"),
        pytest.param("nvidia:\n  deviceMemoryScalling: 2\n", "nvidia.deviceMemoryScaling", id="a letter too many"),
        pytest.param("nvidia:\n  gpuMemoryFactor: 2\n", "nvidia.memoryFactor", id="a factor under another name"),
        pytest.param("vnpu:\n  configs: []\n", "did you mean vnpus", id="a misspelt vendor section we apply"),
        pytest.param("nodeconfigs:\n- name: a\n", "did you mean nodeconfig", id="a misspelt nodeconfig"),
        pytest.param(
            "nvidia:\n  knownMigGeometries:\n  - allowedGeometries: [[{name: 1g.5gb}]]\n",
            "knownMigGeometries[0]",
            id="geometries without models",
        ),
        pytest.param(
            "nvidia:\n  knownMigGeometries:\n  - models: [A30]\n    allowedGeometries: [[{name: big}]]\n",
            "knownMigGeometries[0]: profile 'big'",
            id="a geometry profile not shaped <N>g.<memory>",
        ),
        pytest.param("nvidia:\n  deviceMemoryScaling: .inf\n", "memory scaling inf", id="infinite memory scaling"),
        pytest.param("nvidia:\n  deviceCoreScaling: .nan\n", "core scaling nan", id="core scaling not a number"),
        pytest.param("nodeconfig:\n- name: a\n  devicememoryscaling: .inf\n", "'a'", id="infinite scaling on one node"),
        pytest.param(
            "nvidia:\n  knownMigGeometries:\n  - models: [A30]\n    allowedGeometries: [{name: 1g.6gb}]\n",
            "nvidia.knownMigGeometries",
            id="geometries that are not lists of templates",
        ),
    ],
)
def test_a_misspelt_or_malformed_key_is_refused_naming_it(text: str, named: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_device_config(text)
    assert named in str(caught.value)


_SCALARS = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=12)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_NVIDIA_KEYS = st.sampled_from(
    ["deviceSplitCount", "memoryFactor", "knownMigGeometries", "migProfileAllowlist", "resourceCountName", "x"]
)
_SECTIONS = st.sampled_from(["nvidia", "nodeconfig", "vnpus", "cambricon", "hygon", "metax", "nvdia", "other"])


def _answers_clearly(text: str | bytes) -> None:
    """A config, or InvalidInput with a message; any other exception fails the test with its traceback."""
    try:
        parsed: DeviceConfig | InvalidInput = parse_device_config(text)
    except InvalidInput as err:
        parsed = err
    assert isinstance(parsed, DeviceConfig) or str(parsed)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_any_text_gets_a_config_or_a_clear_error(text: str | bytes) -> None:
    _answers_clearly(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(_SECTIONS, st.dictionaries(_NVIDIA_KEYS | st.text(max_size=6), _VALUES, max_size=4) | _VALUES),
)
def test_any_yaml_shaped_like_a_device_config_gets_a_config_or_a_clear_error(doc: dict[str, object]) -> None:
    _answers_clearly(yaml.safe_dump(doc))


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("nvidia: {\n", id="an unclosed flow mapping"),
        pytest.param("nvidia:\n  - a\n b: c\n", id="bad indentation"),
        pytest.param("? [a, b]\n: c\n", id="an unhashable key"),
        pytest.param("nvidia: &a [*a]\n", id="a self-referencing alias"),
        pytest.param(b"nvidia:\n  resourceCountName: \xff\xfe\n", id="bytes that are not UTF-8"),
        pytest.param("nvidia: !!python/object:os.system {}\n", id="a Python tag"),
        pytest.param("\t- nvidia\n", id="a tab"),
        pytest.param("[" * 3000 + "]" * 3000, id="lists nested deeper than the reader recurses"),
        pytest.param("nvidia: " + "{a: " * 2000 + "1" + "}" * 2000, id="mappings nested deeper than that"),
    ],
)
def test_malformed_yaml_is_a_clear_error_not_a_traceback(text: str | bytes) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_device_config(text)
    assert str(caught.value)
