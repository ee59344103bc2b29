"""Unparsable, negative, fractional or past-int32 GPU quantities are refused at admission with a clear
message naming the resource and the range it accepts (issue 21.3, issue 28.1a); gpucores past 100 too (issue 31.4).

Without this a pod asking for ``nvidia.com/gpumem: lots`` was admitted and then sat pending for ever while
the extender failed on it at every scheduling attempt; and one asking for ``gpumem: 3Gi`` (3221225472 MiB,
past HAMi's int32) was read as asking for no GPU, bound with no placement, and served another pod's grant.
"""

from __future__ import annotations

import pytest

from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY, GPU_PRIORITY, INT32_MAX, MAX_CORES
from tests.webhook.support import ServedWebhook, container, pod, review


@pytest.mark.parametrize(
    ("resources", "resource", "why"),
    [
        pytest.param({GPU: "1", GPU_MEMORY: "lots"}, GPU_MEMORY, "it is not a quantity", id="gpumem lots"),
        pytest.param({GPU: "1", GPU_MEMORY: "-1024"}, GPU_MEMORY, "it is negative", id="negative gpumem"),
        pytest.param({GPU: "1", GPU_MEMORY: "1.5"}, GPU_MEMORY, "it is not a whole number", id="fractional gpumem"),
        pytest.param({GPU: "500m"}, GPU, "it is not a whole number", id="half a GPU"),
        pytest.param({GPU: "-1"}, GPU, "it is negative", id="negative count"),
        pytest.param({GPU: "1", GPU_CORES: "many"}, GPU_CORES, "it is not a quantity", id="gpucores many"),
        pytest.param({GPU: "1", GPU_PRIORITY: "0.5"}, GPU_PRIORITY, "it is not a whole number", id="priority"),
        pytest.param({GPU: "1", GPU_MEMORY: "3Gi"}, GPU_MEMORY, "it is too large", id="gpumem 3Gi"),
        pytest.param({GPU: "1", GPU_MEMORY: "3221225472"}, GPU_MEMORY, "it is too large", id="gpumem past int32"),
        pytest.param({GPU: "2147483648"}, GPU, "it is too large", id="count past int32"),
        pytest.param({GPU: "1", GPU_CORES: "1e10"}, GPU_CORES, "it is too large", id="gpucores past int32"),
        pytest.param({GPU: "1", GPU_CORES: "150"}, GPU_CORES, "it is too large", id="gpucores past 100"),
        pytest.param({GPU: "1", GPU_CORES: "101"}, GPU_CORES, "it is too large", id="gpucores 101"),
    ],
)
@pytest.mark.parametrize("where", ["limits", "requests"])
def test_bad_gpu_quantity_is_refused_with_a_message_naming_it(
    webhook: ServedWebhook, resources: dict[str, str], resource: str, why: str, where: str
) -> None:
    ctr = container("trainer", limits=resources) if where == "limits" else container("trainer", requests=resources)
    response = webhook.admit(review(pod(ctr, scheduler=None)))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    message = response["status"]["message"]
    high = MAX_CORES if resource == GPU_CORES else INT32_MAX  # cores are a percentage of one card
    assert message == (
        f"invalid {resource} value {resources[resource]!r} in container trainer: {why}; "
        f"it must be a whole number from 0 to {high}"
    )


def test_bad_quantity_in_an_init_container_is_refused_too(webhook: ServedWebhook) -> None:
    sent = pod(container(limits={GPU: "1"}), init=(container("setup", limits={GPU: "1", GPU_MEMORY: "lots"}),))
    response = webhook.admit(review(sent))
    assert response["allowed"] is False
    assert "container setup" in response["status"]["message"]


@pytest.mark.parametrize("memory", ["1024", "1Ki", "2e3", "3k", "2147483647"])
def test_whole_quantities_in_any_notation_are_admitted(webhook: ServedWebhook, memory: str) -> None:
    # kube-apiserver hands the webhook canonical quantities ("3000" becomes "3k"): a suffix is no refusal
    assert webhook.admit(review(pod(container(limits={GPU: "1", GPU_MEMORY: memory}))))["allowed"] is True
