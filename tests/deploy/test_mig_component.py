"""The mig component (deploy/kustomize/components/mig): what NVML needs to create and destroy MIG instances,
given to the allocator container only, and nothing else changed. Without it no container holds a capability
(tests/deploy/test_policy.py), and NVML's NVML_ERROR_NO_PERMISSION names the component
(tests/nodeagent/test_mig_inventory.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import pytest

from tests.deploy.manifests import Rendering, env_of, render_with_component

NODE: Final = "hami-node"


@pytest.mark.parametrize("base", ["dev", "production"])
def test_the_mig_component_gives_the_allocator_alone_what_nvml_mig_needs(
    kubectl: str, deploy_tree: Path, renderings: dict[str, Rendering], base: str
) -> None:
    plain = renderings[base]
    mig = render_with_component(deploy_tree, kubectl, base, "mig")
    allocator = mig.container(NODE, "allocator").container
    security = allocator["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert security.get("privileged", False) is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    env = env_of(allocator)
    assert env["NVIDIA_MIG_CONFIG_DEVICES"]["value"] == "all"
    assert env["NVIDIA_MIG_MONITOR_DEVICES"]["value"] == "all"
    # the rest of the allocator, the node agent and every other object are the overlay's own
    before = plain.container(NODE, "allocator").container
    added = {"NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"}
    assert {k: v for k, v in env.items() if k not in added} == env_of(before)
    assert {k: v for k, v in allocator.items() if k not in ("env", "securityContext")} == {
        k: v for k, v in before.items() if k not in ("env", "securityContext")
    }
    assert mig.container(NODE, "nodeagent").container == plain.container(NODE, "nodeagent").container
    assert [o for o in mig.objects if o["kind"] != "DaemonSet"] == [
        o for o in plain.objects if o["kind"] != "DaemonSet"
    ]


def test_without_the_component_the_allocator_holds_no_capability(overlay: Rendering) -> None:
    allocator = overlay.container(NODE, "allocator").container
    assert allocator["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "NVIDIA_MIG_CONFIG_DEVICES" not in env_of(allocator)
