"""Scheduler-owned annotations (ARCHITECTURE §3): tenants may not set or change them; the system may."""

from __future__ import annotations

import copy

import pytest

from hami_common.annotations import BIND_PHASE, DEVICES_TO_ALLOCATE, NODE_LOCK, TRACE_CONTEXT, VGPU_NODE
from hami_common.resources import GPU
from hami_webhook.settings import DEFAULT_SYSTEM_USERS
from tests.webhook.support import Json, ServedWebhook, container, patched, pod, review

EXTENDER = DEFAULT_SYSTEM_USERS[0]
TENANT = "system:serviceaccount:team-a:default"
FORGED = "GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76,NVIDIA,81920,100:;"


def placed_pod() -> Json:
    return pod(container(limits={GPU: "1", "nvidia.com/gpucores": "100"}), scheduler="hami-scheduler", annotations={})


def forged(p: Json, key: str = DEVICES_TO_ALLOCATE, value: str = FORGED) -> Json:
    result = copy.deepcopy(p)
    result["metadata"]["annotations"][key] = value
    return result


def test_tenant_update_forging_devices_to_allocate_is_denied(webhook: ServedWebhook) -> None:
    old = placed_pod()
    response = webhook.admit(review(forged(old), operation="UPDATE", old=old, user=TENANT))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert DEVICES_TO_ALLOCATE in response["status"]["message"]
    assert TENANT in response["status"]["message"]


def test_the_same_update_from_the_extender_is_allowed_unchanged(webhook: ServedWebhook) -> None:
    old = placed_pod()
    response = webhook.admit(review(forged(old), operation="UPDATE", old=old, user=EXTENDER))
    assert response["allowed"] is True
    assert "patch" not in response


@pytest.mark.parametrize(
    ("key", "old_value", "new_value"),
    [
        (BIND_PHASE, "allocating", "success"),
        (VGPU_NODE, "node-1", "node-2"),
        (NODE_LOCK, None, "2026-08-21T08:20:39+02:00,default,gpu-pod"),
        (DEVICES_TO_ALLOCATE, FORGED, None),
    ],
    ids=["changing the bind phase", "moving the node", "setting a lock", "erasing the device list"],
)
def test_tenant_update_touching_a_reserved_annotation_is_denied(
    webhook: ServedWebhook, key: str, old_value: str | None, new_value: str | None
) -> None:
    old, new = placed_pod(), placed_pod()
    if old_value is not None:
        old["metadata"]["annotations"][key] = old_value
    if new_value is not None:
        new["metadata"]["annotations"][key] = new_value
    response = webhook.admit(review(new, operation="UPDATE", old=old, user=TENANT))
    assert response["allowed"] is False
    assert key in response["status"]["message"]


def test_tenant_update_of_other_annotations_is_allowed(webhook: ServedWebhook) -> None:
    old = forged(placed_pod(), BIND_PHASE, "allocating")
    new = forged(old, "team/owner", "alice")
    response = webhook.admit(review(new, operation="UPDATE", old=old, user=TENANT))
    assert response["allowed"] is True


@pytest.mark.parametrize("key", [DEVICES_TO_ALLOCATE, VGPU_NODE, TRACE_CONTEXT])
def test_tenant_create_with_a_reserved_annotation_is_denied(webhook: ServedWebhook, key: str) -> None:
    response = webhook.admit(review(forged(pod(container(limits={GPU: "1"}), annotations={}), key), user=TENANT))
    assert response["allowed"] is False
    assert key in response["status"]["message"]


def test_system_create_with_reserved_annotations_is_mutated_as_usual(webhook: ServedWebhook) -> None:
    original = forged(pod(container(limits={GPU: "1"}), annotations={}))
    response = webhook.admit(review(original, user=EXTENDER))
    assert response["allowed"] is True
    assert patched(original, response)["spec"]["schedulerName"] == "hami-scheduler"
