"""The allocator applies the node's ``nodeconfig`` entry as the node agent does (issue 18.2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hami_allocator.inventory import DiscoveredInventory
from hami_allocator.settings import AllocatorSettings
from hami_common.errors import InvalidInput
from hami_common.inventory import open_inventory
from hami_nodeagent.settings import NodeAgentSettings

NODE = "gpu-node-7"


def _node_config(tmp_path: Path, entry: dict[str, object]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"nodeconfig": [{"name": "elsewhere", "devicesplitcount": 2}, {"name": NODE, **entry}]}))
    return str(path)


def test_allocator_and_node_agent_take_the_same_entry_of_this_node(tmp_path: Path) -> None:
    path = _node_config(
        tmp_path,
        {
            "devicesplitcount": 3,
            "devicememoryscaling": 1.5,
            "libcudaloglevel": 3,
            "enablenumatopology": True,
            "enablegetpreferredallocation": False,
            "migstrategy": "none",
            "filterdevices": {"uuid": ["GPU-b"], "index": []},
        },
    )
    allocator = AllocatorSettings(node_name=NODE, node_config_file=path).node_config()
    agent = NodeAgentSettings(node_name=NODE, inventory="fake", node_config_file=path).node_config()
    assert allocator.split_count == agent.split_count == 3
    assert (allocator.numa_topology, allocator.preferred_allocation) == (True, False)
    assert allocator.libcuda_log_level == agent.libcuda_log_level == "3"
    env = AllocatorSettings(node_name=NODE, node_config_file=path).allocation_config(allocator)
    assert (env.libcuda_log_level, env.device_memory_scaling) == ("3", 1.5)


async def test_a_filtered_gpu_is_not_advertised_to_the_kubelet(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    gpus = [{"uuid": f"GPU-{c}", "index": i, "model": "A100", "memory_mib": 1024} for i, c in enumerate("abc")]
    inventory.write_text(yaml.safe_dump({"nodes": {NODE: gpus}}))
    config = AllocatorSettings(
        node_name=NODE, node_config_file=_node_config(tmp_path, {"filterdevices": {"uuid": ["GPU-b"], "index": [2]}})
    ).node_config()
    discovered = DiscoveredInventory(
        open_inventory("fake", node=NODE, fake_file=str(inventory)), visible=config.registers
    )
    await discovered.refresh()
    assert [g.uuid for g in discovered.snapshot().gpus] == ["GPU-a"]


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        pytest.param({"operatingmode": "mps"}, "operating mode", id="an unknown operating mode"),
        pytest.param({"migstrategy": "all"}, "migstrategy", id="an unknown MIG strategy"),
        pytest.param({"devicesplitcount": 0}, "split count", id="a zero split count"),
        pytest.param({"enablenumatopolgy": True}, "enablenumatopolgy", id="a misspelt key"),
    ],
)
def test_an_entry_the_node_cannot_apply_is_refused_at_start_with_the_reason(
    tmp_path: Path, entry: dict[str, object], reason: str
) -> None:
    with pytest.raises(InvalidInput, match=reason):
        AllocatorSettings(node_name=NODE, node_config_file=_node_config(tmp_path, entry))
