"""The dra component (deploy/kustomize/components/dra): HAMi-DRA's DeviceClass, the webhook and the node agent
in DRA mode with the least RBAC that mode needs, the webhook registered NoneOnDryRun, and nothing else
changed. The real apiserver applies it in tests/realk8s/test_dra_allocation.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import kubernetes_validate
import pytest

from hami_common.dra.names import DEVICE_CLASS, DEVICE_TYPE, DRIVER
from hami_common.settings import ENV_PREFIX, load
from tests.deploy.manifests import Rendering, env_of, render_with_component
from tests.deploy.test_settings import FROM_REFERENCE, service_containers, settings_class

NODE: Final = "hami-node"
WEBHOOK: Final = "hami-webhook"
ADDED: Final = frozenset({"DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"})


def _rules(rendering: Rendering, role: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = rendering.get("ClusterRole", role)["rules"]
    return rules


@pytest.fixture(scope="module", params=["dev", "production"])
def pair(
    request: pytest.FixtureRequest, kubectl: str, deploy_tree: Path, renderings: dict[str, Rendering]
) -> tuple[Rendering, Rendering]:
    base: str = request.param
    return renderings[base], render_with_component(deploy_tree, kubectl, base, "dra")


def test_every_object_of_the_dra_overlay_is_valid_kubernetes(pair: tuple[Rendering, Rendering]) -> None:
    _, dra = pair
    for obj in dra.of_kind("DeviceClass") + dra.of_kind("ValidatingAdmissionPolicy") + dra.of_kind("ClusterRole"):
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


def test_the_device_class_is_hami_dras(pair: tuple[Rendering, Rendering]) -> None:
    _, dra = pair
    [selector] = dra.get("DeviceClass", DEVICE_CLASS)["spec"]["selectors"]
    expression = selector["cel"]["expression"]
    assert f'device.driver == "{DRIVER}"' in expression
    assert f'device.attributes["{DRIVER}"].type == "{DEVICE_TYPE}"' in expression


def test_the_webhook_runs_in_dra_mode_registered_none_on_dry_run_and_creates_templates_only(
    pair: tuple[Rendering, Rendering],
) -> None:
    plain, dra = pair
    assert env_of(dra.container(WEBHOOK, "webhook").container)["HAMI_DRA"]["value"] == "true"
    assert [h["sideEffects"] for h in dra.get("MutatingWebhookConfiguration", WEBHOOK)["webhooks"]] == ["NoneOnDryRun"]
    assert [h["sideEffects"] for h in plain.get("MutatingWebhookConfiguration", WEBHOOK)["webhooks"]] == ["None"]
    assert _rules(dra, "hami-webhook-dra") == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": ["create"]}
    ]
    binding = dra.get("ClusterRoleBinding", "hami-webhook-dra")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": WEBHOOK, "namespace": "hami-system"}]


def test_the_node_agent_publishes_slices_restricted_to_its_node(pair: tuple[Rendering, Rendering]) -> None:
    _, dra = pair
    assert env_of(dra.container(NODE, "nodeagent").container)["HAMI_DRA"]["value"] == "true"
    assert "HAMI_DRA" not in env_of(dra.container(NODE, "allocator").container)
    assert _rules(dra, "hami-node-dra") == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["list", "create", "update", "delete"],
        }
    ]
    policy = dra.get("ValidatingAdmissionPolicy", "hami-node-resourceslices")
    assert policy["spec"]["failurePolicy"] == "Fail"
    binding = dra.get("ValidatingAdmissionPolicyBinding", "hami-node-resourceslices")
    assert binding["spec"] == {"policyName": "hami-node-resourceslices", "validationActions": ["Deny"]}


def test_nothing_else_changes(pair: tuple[Rendering, Rendering]) -> None:
    plain, dra = pair
    changed = {"MutatingWebhookConfiguration", "Deployment", "DaemonSet"}

    def rest(rendering: Rendering) -> list[dict[str, Any]]:
        return [
            o
            for o in rendering.objects
            if o["kind"] not in changed | ADDED and not o["metadata"]["name"].endswith("-dra")
        ]

    assert rest(dra) == rest(plain)
    for kind in ("Deployment", "DaemonSet"):
        names = {o["metadata"]["name"] for o in plain.of_kind(kind)}
        assert {o["metadata"]["name"] for o in dra.of_kind(kind)} == names
    for name in {o["metadata"]["name"] for o in plain.of_kind("Deployment")} - {WEBHOOK}:
        assert dra.get("Deployment", name) == plain.get("Deployment", name)


def test_the_webhook_and_the_node_agent_load_their_settings_in_dra_mode(pair: tuple[Rendering, Rendering]) -> None:
    _, dra = pair
    modes: dict[str, object] = {}
    for ref, command in service_containers(dra):
        env = {
            name: str(entry.get("value", FROM_REFERENCE))
            for name, entry in env_of(ref.container).items()
            if name.startswith(ENV_PREFIX)
        }
        settings: object = load(settings_class(command), [], env=env)
        modes[command] = getattr(settings, "dra", None)
    assert (modes["hami-webhook"], modes["hami-nodeagent"]) == (True, True)
    assert modes["hami-allocator"] is None  # the device plugin has no DRA mode
