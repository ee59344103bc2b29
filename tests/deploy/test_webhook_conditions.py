"""The webhook's matchConditions, evaluated by a CEL interpreter over real-shaped pods: GPU pods and pods
carrying hami.io/ annotations are sent to the webhook, every other pod is admitted without it (so the
fail-closed webhook can never block them), and kube-system never is."""

from __future__ import annotations

import re
from typing import Any, Final

import pytest

from hami_common.annotations import VGPU_NODE
from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY
from hami_webhook.settings import DEFAULT_SYSTEM_USERS
from tests.deploy.manifests import Rendering, env_of

celpy = pytest.importorskip("celpy", reason="cel-python (a CEL interpreter) is not installed: add it to the dev extras")

Obj = dict[str, Any]
TENANT: Final = "team-a"


def pod(containers: list[Obj], *, init: list[Obj] | None = None, annotations: dict[str, str] | None = None) -> Obj:
    metadata: Obj = {"name": "p", "namespace": TENANT}
    if annotations is not None:
        metadata["annotations"] = annotations
    spec: Obj = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def container(limits: dict[str, str] | None = None, requests: dict[str, str] | None = None) -> Obj:
    resources: Obj = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": "c", "image": "busybox", "resources": resources}


def gated(
    rendering: Rendering, obj: Obj, namespace: str = TENANT, operation: str = "CREATE", user: str = "jane"
) -> bool:
    """Whether every matchCondition holds, i.e. the apiserver calls the webhook for this request."""
    config = rendering.get("MutatingWebhookConfiguration", "hami-webhook")
    (hook,) = config["webhooks"]
    env = celpy.Environment()
    activation = {
        "object": celpy.json_to_cel(obj),
        "request": celpy.json_to_cel(
            {"namespace": namespace, "operation": operation, "userInfo": {"username": user, "groups": []}}
        ),
    }
    for condition in hook["matchConditions"]:
        program = env.program(env.compile(condition["expression"]))
        result = program.evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), f"{condition['name']}: {result!r}"
        if not result:
            return False
    return True


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        pytest.param(pod([container({GPU: "1"})]), True, id="a container with a GPU limit is gated"),
        pytest.param(pod([container({GPU_MEMORY: "3000"})]), True, id="memory alone is a GPU request"),
        pytest.param(pod([container(requests={GPU_CORES: "30"})]), True, id="a GPU resource in requests is gated"),
        pytest.param(
            pod([container({"cpu": "1"})], init=[container({GPU: "1"})]), True, id="a GPU init container is gated"
        ),
        pytest.param(
            pod([container()], annotations={VGPU_NODE: "node-a"}), True, id="a pod with hami annotations is gated"
        ),
        pytest.param(pod([container({"cpu": "1", "memory": "1Gi"})]), False, id="a CPU pod is not gated"),
        pytest.param(pod([{"name": "c", "image": "busybox"}]), False, id="a pod without resources is not gated"),
        pytest.param(
            pod([container()], annotations={"team": "a"}), False, id="a pod with other annotations is not gated"
        ),
    ],
)
def test_only_gpu_pods_reach_the_webhook(dev: Rendering, obj: Obj, expected: bool) -> None:
    assert gated(dev, obj) == expected


def test_a_forged_annotation_on_update_reaches_the_webhook(dev: Rendering) -> None:
    forged = pod([container()], annotations={VGPU_NODE: "node-a"})
    assert gated(dev, forged, operation="UPDATE")


def test_kube_system_gpu_pods_never_reach_the_webhook(dev: Rendering) -> None:
    assert not gated(dev, pod([container({GPU: "1"})]), namespace="kube-system")


def _system_users(rendering: Rendering) -> list[str]:
    """The webhook's HAMI_SYSTEM_USERS as the rendering sets it (the settings' default when unset)."""
    value = env_of(rendering.container("hami-webhook", "webhook").container).get("HAMI_SYSTEM_USERS")
    return list(DEFAULT_SYSTEM_USERS) if value is None else [u.strip() for u in value["value"].split(",")]


@pytest.mark.parametrize("overlay", ["base", "dev", "production"])
def test_our_own_services_updates_skip_the_webhook_and_every_other_update_reaches_it(
    renderings: dict[str, Rendering], overlay: str
) -> None:
    rendering = renderings[overlay]
    placed = pod([container({GPU: "1"})], annotations={VGPU_NODE: "node-a"})
    users = _system_users(rendering)
    ours = [u for u in users if u.startswith("system:serviceaccount:hami-system:")]
    assert ours, users
    for user in ours:
        # the extender's placement patch and the allocator's acknowledgement: no webhook round trip
        assert not gated(rendering, placed, operation="UPDATE", user=user)
        # but a pod the node or the extender would create still goes through it, as every create does
        assert gated(rendering, placed, operation="CREATE", user=user)
    for user in ("jane", "system:serviceaccount:team-a:default", "system:serviceaccount:hami-system:default"):
        assert gated(rendering, placed, operation="UPDATE", user=user), user


@pytest.mark.parametrize("overlay", ["base", "dev", "production"])
def test_only_the_webhooks_system_users_are_spared_the_webhook(renderings: dict[str, Rendering], overlay: str) -> None:
    """An account skipped by the condition must be one the webhook would wave through anyway."""
    rendering = renderings[overlay]
    config = rendering.get("MutatingWebhookConfiguration", "hami-webhook")
    (hook,) = config["webhooks"]
    (condition,) = [c for c in hook["matchConditions"] if c["name"] == "not-an-update-by-hami"]
    skipped = re.findall(r"'(system:serviceaccount:[^']+)'", condition["expression"])
    assert skipped
    assert set(skipped) <= set(_system_users(rendering))
