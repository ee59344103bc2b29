"""Every shipped device family's pods are routed to us on a real cluster by the deployed manifests: the
webhook's matchConditions send them to the webhook, the scheduler-owned policy guards their placement
annotations and knows them as device pods, and kube-scheduler's managedResources hand them to the
extender. The expected names come from the registry (tests/deploy/families.py); the CEL is evaluated by
cel-python over the rendered overlays (tests/realk8s/test_vendors_real.py runs it in kube-apiserver)."""

from __future__ import annotations

import re
from typing import Any, Final

import pytest
import yaml

from hami_common.annotations import GRANT_OWNED
from tests.deploy.families import ShippedFamily, nvidia_resources, shipped_families
from tests.deploy.manifests import Rendering
from tests.deploy.test_webhook_conditions import container, gated, pod

celpy = pytest.importorskip("celpy", reason="cel-python (a CEL interpreter) is not installed: add it to the dev extras")

Obj = dict[str, Any]
FAMILIES: Final = shipped_families()
SCHEDULER_CONFIGMAP: Final = "hami-kube-scheduler"


def _ids(family: ShippedFamily) -> str:
    return family.word


def _managed(rendering: Rendering) -> dict[str, bool]:
    """managedResources of the deployed KubeSchedulerConfiguration: name -> ignoredByScheduler."""
    configmap = rendering.get("ConfigMap", SCHEDULER_CONFIGMAP)
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    (extender,) = config["extenders"]
    return {r["name"]: bool(r.get("ignoredByScheduler", False)) for r in extender["managedResources"]}


def _policy(rendering: Rendering) -> Obj:
    return rendering.get("ValidatingAdmissionPolicy", "hami-scheduler-owned")


def _variable(policy: Obj, name: str) -> str:
    (found,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    return str(found)


def _evaluate(expression: str, activation: Obj) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate({k: celpy.json_to_cel(v) for k, v in activation.items()})


def _owned_keys() -> set[str]:
    return set(GRANT_OWNED) | {k for s in FAMILIES for k in s.family.owned_annotations}


def test_the_registry_ships_more_than_nvidia() -> None:
    assert len({s.family.resource_names[0].split("/")[0] for s in FAMILIES}) >= 3


@pytest.mark.parametrize("shipped", FAMILIES, ids=_ids)
def test_kube_scheduler_asks_the_extender_about_every_resource_of_each_family(
    overlay: Rendering, shipped: ShippedFamily
) -> None:
    managed = _managed(overlay)
    missing = [name for name in shipped.family.resource_names if name not in managed]
    assert missing == [], f"{shipped.word}: kube-scheduler would answer Insufficient {missing} itself"


@pytest.mark.parametrize("shipped", FAMILIES, ids=_ids)
def test_kube_scheduler_counts_only_what_the_familys_kubelet_reports(
    overlay: Rendering, shipped: ShippedFamily
) -> None:
    managed = _managed(overlay)
    for name in shipped.family.resource_names:
        assert managed[name] == (name not in shipped.advertised), f"{name}: ignoredByScheduler {managed[name]}"


def test_kube_scheduler_counts_only_nvidias_advertised_count(overlay: Rendering) -> None:
    managed = _managed(overlay)
    assert {name: not managed[name] for name in nvidia_resources()} == dict(nvidia_resources())


def test_kube_scheduler_manages_no_resource_that_no_family_names(overlay: Rendering) -> None:
    known = set(nvidia_resources()) | {n for s in FAMILIES for n in s.family.resource_names}
    assert set(_managed(overlay)) - known == set()


@pytest.mark.parametrize("shipped", FAMILIES, ids=_ids)
def test_a_pod_asking_for_any_resource_of_each_family_reaches_the_webhook(
    dev: Rendering, shipped: ShippedFamily
) -> None:
    for name in shipped.family.resource_names:
        assert gated(dev, pod([container({name: "1"})])), f"{name} in limits"
        assert gated(dev, pod([container(requests={name: "1"})])), f"{name} in requests"
        assert gated(dev, pod([container()], init=[container({name: "1"})])), f"{name} in an init container"


@pytest.mark.parametrize("shipped", FAMILIES, ids=_ids)
def test_a_pod_carrying_a_familys_placement_annotation_reaches_the_webhook(
    dev: Rendering, shipped: ShippedFamily
) -> None:
    for key in shipped.family.owned_annotations:
        assert gated(dev, pod([container()], annotations={key: "forged"})), key


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param({"cpu": "1"}, id="a CPU pod"),
        pytest.param({"example.com/fpga": "1"}, id="another vendor's device"),
        pytest.param({"huawei.com/Ascend910": "1"}, id="an Ascend name no shipped family configures"),
    ],
)
def test_a_pod_without_a_shipped_familys_resource_still_skips_the_webhook(dev: Rendering, limits: Obj) -> None:
    assert not gated(dev, pod([container(limits)]))


def test_the_policy_guards_every_familys_placement_annotations(overlay: Rendering) -> None:
    listed = set(re.findall(r"'([^']*)'", _variable(_policy(overlay), "annotations")))
    assert listed == _owned_keys()


@pytest.mark.parametrize("shipped", FAMILIES, ids=_ids)
def test_the_policy_knows_each_familys_pods_as_device_pods(dev: Rendering, shipped: ShippedFamily) -> None:
    expression = _variable(_policy(dev), "asksForGpus")
    for name in shipped.family.resource_names:
        for obj in (pod([container({name: "1"})]), pod([container()], init=[container(requests={name: "1"})])):
            assert _evaluate(expression, {"object": obj}) == celpy.celtypes.BoolType(True), name
    assert _evaluate(expression, {"object": pod([container({"cpu": "1"})])}) == celpy.celtypes.BoolType(False)


@pytest.mark.parametrize("shipped", FAMILIES, ids=_ids)
def test_the_policy_refuses_a_tenant_writing_a_familys_placement_annotation(
    dev: Rendering, shipped: ShippedFamily
) -> None:
    policy = _policy(dev)
    annotations = _evaluate(_variable(policy, "annotations"), {})
    guard = policy["spec"]["validations"][0]["expression"]
    for key in shipped.family.owned_annotations:
        variables = {"annotations": annotations, "newAnnotations": {key: "forged"}, "oldAnnotations": {}}
        verdict = _evaluate(guard, {"variables": variables})
        assert verdict == celpy.celtypes.BoolType(False), f"{key}: a tenant may set it"
    plain = {"annotations": annotations, "newAnnotations": {"team": "a"}, "oldAnnotations": {}}
    assert _evaluate(guard, {"variables": plain}) == celpy.celtypes.BoolType(True)


def test_the_policy_lets_a_write_keeping_every_annotation_pass_and_still_refuses_a_removal(dev: Rendering) -> None:
    """The two maps compared first (the kubelet's status writes keep them equal), then key by key."""
    policy = _policy(dev)
    annotations = _evaluate(_variable(policy, "annotations"), {})
    guard = policy["spec"]["validations"][0]["expression"]
    placed = {"hami.io/vgpu-node": "n1", "team": "a"}
    kept = {"annotations": annotations, "newAnnotations": dict(placed), "oldAnnotations": dict(placed)}
    assert _evaluate(guard, {"variables": kept}) == celpy.celtypes.BoolType(True)
    removed = {"annotations": annotations, "newAnnotations": {"team": "a"}, "oldAnnotations": dict(placed)}
    assert _evaluate(guard, {"variables": removed}) == celpy.celtypes.BoolType(False)
    relabelled = {"annotations": annotations, "newAnnotations": {**placed, "team": "b"}, "oldAnnotations": placed}
    assert _evaluate(guard, {"variables": relabelled}) == celpy.celtypes.BoolType(True)
