"""HAMi's admission rules, each through a real AdmissionReview over HTTPS (hami-protocol §3, §8 cases 9, 10).

Every allowed case applies the returned JSON Patch to the original pod with ``jsonpatch`` and compares the
result with the pod the rule describes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from hami_common.envvars import CUDA_DISABLE_CONTROL, CUDA_TASK_PRIORITY
from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY, GPU_MEMORY_PERCENTAGE, GPU_PRIORITY
from tests.webhook.support import Json, ServedWebhook, container, patch_ops, patched, pod, review

HAMI = "hami-scheduler"


def changed(original: Json, edit: Callable[[Json], None]) -> Json:
    result = copy.deepcopy(original)
    edit(result)
    return result


def scheduled(p: Json) -> None:
    p["spec"]["schedulerName"] = HAMI


def limits(p: Json, index: int = 0, kind: str = "containers") -> dict[str, str]:
    found: dict[str, str] = p["spec"][kind][index]["resources"].setdefault("limits", {})
    return found


def exclusive_and_scheduled(p: Json) -> None:
    limits(p)[GPU_CORES] = "100"
    scheduled(p)


Edit = Callable[[Json], None]


def all_of(*edits: Edit) -> Edit:
    def edit(p: Json) -> None:
        for one in edits:
            one(p)

    return edit


def set_limits(**values: str) -> Edit:
    names = {"gpu": GPU, "cores": GPU_CORES}
    return lambda p: limits(p).update({names[k]: v for k, v in values.items()})


def append_env(name: str, value: str) -> Edit:
    return lambda p: p["spec"]["containers"][0].setdefault("env", []).append({"name": name, "value": value})


def drop_env(index: int) -> Edit:
    return lambda p: p["spec"]["containers"][0]["env"].pop(index)


def unchanged(p: Json) -> None:
    return None


ALLOWED: list[Any] = [
    pytest.param(
        pod(container(limits={GPU: "1"})),
        exclusive_and_scheduled,
        id="a whole-GPU request gets gpucores 100 and the HAMi scheduler",
    ),
    pytest.param(
        pod(container(limits={GPU: "1", GPU_MEMORY_PERCENTAGE: "100"})),
        exclusive_and_scheduled,
        id="100 percent of the memory is exclusive too",
    ),
    pytest.param(
        pod(container(limits={GPU: "1", GPU_MEMORY_PERCENTAGE: "50"})),
        scheduled,
        id="half the memory shares the card: no cores are injected",
    ),
    pytest.param(
        pod(container(limits={GPU: "1", GPU_MEMORY: "8192"})),
        scheduled,
        id="memory in MiB shares the card: no cores are injected",
    ),
    pytest.param(
        pod(container(limits={GPU: "1", GPU_CORES: "70"})),
        scheduled,
        id="explicit cores are kept",
    ),
    pytest.param(
        pod(container(limits={GPU_MEMORY: "3000"})),
        all_of(set_limits(gpu="1"), scheduled),
        id="memory alone in limits gets the default GPU count",
    ),
    pytest.param(
        pod(container(limits={GPU_CORES: "30"})),
        all_of(set_limits(gpu="1"), scheduled),
        id="cores alone in limits get the default GPU count and no exclusive cores",
    ),
    pytest.param(
        pod(container(limits={GPU_MEMORY_PERCENTAGE: "100"})),
        all_of(set_limits(gpu="1", cores="100"), scheduled),
        id="a whole-card percentage alone gets the count and then exclusive cores",
    ),
    pytest.param(
        pod(container(requests={GPU: "1"})),
        exclusive_and_scheduled,
        id="a count only in requests is exclusive: limits are created for the cores",
    ),
    pytest.param(
        pod(container(limits={GPU: "1", GPU_PRIORITY: "1"})),
        all_of(append_env(CUDA_TASK_PRIORITY, "1"), exclusive_and_scheduled),
        id="a priority in limits becomes CUDA_TASK_PRIORITY",
    ),
    pytest.param(
        pod(container(limits={GPU: "1", GPU_PRIORITY: "0"}, env=[{"name": "A", "value": "b"}])),
        all_of(append_env(CUDA_TASK_PRIORITY, "0"), exclusive_and_scheduled),
        id="injected env is appended after the container's own",
    ),
    pytest.param(
        pod(container("app"), init=(container("warmup", limits={GPU: "1", GPU_MEMORY: "1000"}),)),
        scheduled,
        id="init containers are GPU containers too",
    ),
    pytest.param(
        pod(container(limits={GPU: "1"}), scheduler=None),
        exclusive_and_scheduled,
        id="a pod without a schedulerName gets the HAMi scheduler",
    ),
    pytest.param(
        pod(container(limits={GPU: "1"}), scheduler=HAMI),
        set_limits(cores="100"),
        id="a pod that already names the HAMi scheduler is still mutated",
    ),
    pytest.param(
        pod(container(limits={"cpu": "2", "memory": "1Gi"})),
        unchanged,
        id="a pod without GPUs is left alone",
    ),
    pytest.param(
        pod(container(limits={GPU: "1"}), scheduler="volcano"),
        unchanged,
        id="a pod for another scheduler is allowed unchanged",
    ),
    pytest.param(
        pod(container(privileged=True)),
        unchanged,
        id="a privileged pod without GPUs is allowed",
    ),
    pytest.param(
        pod(
            container(
                limits={GPU: "1", GPU_CORES: "20"},
                env=[{"name": CUDA_DISABLE_CONTROL, "value": "true"}, {"name": "KEEP", "value": "1"}],
            ),
            container("sidecar", env=[{"name": CUDA_DISABLE_CONTROL, "value": "true"}]),
        ),
        all_of(drop_env(0), scheduled),
        id="CUDA_DISABLE_CONTROL is removed from GPU containers only",
    ),
]


@pytest.mark.parametrize(("original", "describe"), ALLOWED)
def test_allowed_pod_is_patched_into_the_pod_the_rule_describes(
    webhook: ServedWebhook, original: Json, describe: Callable[[Json], None]
) -> None:
    response = webhook.admit(review(original))
    assert response["allowed"] is True
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert patched(original, response) == changed(original, describe)


def test_pod_for_another_scheduler_gets_hamis_message(webhook: ServedWebhook) -> None:
    response = webhook.admit(review(pod(container(limits={GPU: "1"}), scheduler="volcano")))
    assert response["allowed"] is True
    assert response["status"]["message"] == "pod already has different scheduler assigned"
    assert patch_ops(response) == []


def test_pod_without_gpus_gets_no_patch_and_no_patch_type(webhook: ServedWebhook) -> None:
    response = webhook.admit(review(pod(container())))
    assert response == {"uid": response["uid"], "allowed": True, "status": {"code": 200}}


DENIED: list[Any] = [
    pytest.param(
        changed(pod(), lambda p: p["spec"].__setitem__("containers", [])),
        "pod has no containers",
        id="a pod without containers",
    ),
    pytest.param(
        pod(container(limits={GPU: "1"}), container("debug", privileged=True)),
        "container debug is privileged",
        id="a privileged container in a GPU pod",
    ),
    pytest.param(
        pod(container(limits={GPU: "1"}, privileged=True)),
        "container main is privileged",
        id="a privileged GPU container",
    ),
    pytest.param(
        pod(container(limits={GPU: "1"}), node_name="node-1"),
        "pod has node assigned",
        id="a GPU pod that names its node",
    ),
]


@pytest.mark.parametrize(("original", "message"), DENIED)
def test_denied_with_hamis_message(webhook: ServedWebhook, original: Json, message: str) -> None:
    response = webhook.admit(review(original))
    assert response["allowed"] is False
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": message}
    assert "patch" not in response


@pytest.mark.parametrize("percentage", ["101", "150", "-1"])
def test_percentage_out_of_range_is_errored_500_with_hamis_message(webhook: ServedWebhook, percentage: str) -> None:
    response = webhook.admit(review(pod(container(limits={GPU: "1", GPU_MEMORY_PERCENTAGE: percentage}))))
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 500,
        "message": f"invalid nvidia.com/gpumem-percentage value {percentage} in container main: "
        "must be an integer between 0 and 100",
    }


@pytest.mark.parametrize("percentage", ["0", "100"])
def test_percentage_at_the_bounds_is_accepted(webhook: ServedWebhook, percentage: str) -> None:
    response = webhook.admit(review(pod(container(limits={GPU: "1", GPU_MEMORY_PERCENTAGE: percentage}))))
    assert response["allowed"] is True


def test_gpu_in_an_ephemeral_container_is_denied(webhook: ServedWebhook) -> None:
    original = pod(container())
    original["spec"]["ephemeralContainers"] = [container("debugger", limits={GPU: "1"})]
    response = webhook.admit(review(original, operation="UPDATE", old=pod(container())))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "ephemeral container debugger requests nvidia.com/gpu: ephemeral containers cannot have GPUs"
    )


def test_object_that_is_not_a_pod_is_errored_400(webhook: ServedWebhook) -> None:
    response = webhook.admit(review({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 1}}))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400


def test_create_without_object_is_errored_400(webhook: ServedWebhook) -> None:
    response = webhook.admit(review(None))
    assert response["status"] == {"code": 400, "message": "there is no content to decode"}


def test_delete_is_allowed_untouched(webhook: ServedWebhook) -> None:
    response = webhook.admit(review(None, operation="DELETE", old=pod(container(limits={GPU: "1"}))))
    assert response == {"uid": response["uid"], "allowed": True, "status": {"code": 200}}
