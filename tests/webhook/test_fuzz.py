"""Fuzzing the body over real HTTPS: every answer is a well-formed AdmissionReview or HTTP 400, never a
500 or a dropped connection, and the server keeps serving."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY, GPU_MEMORY_PERCENTAGE, GPU_PRIORITY
from hami_webhook.reviewer import INTERNAL_ERROR
from tests.webhook.support import Json, ServedWebhook, container, pod, review

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
quantities = st.one_of(
    st.sampled_from(
        ["1", "0", "-1", "100", "101", "1Gi", "16Gi", "1.5", "500m", "1e3", "1e999", "9" * 60, "9" * 5000, "", "x"]
    ),
    st.text(max_size=20),
)
RESOURCES = [GPU, GPU_CORES, GPU_MEMORY, GPU_MEMORY_PERCENTAGE, GPU_PRIORITY]


def check_answer(webhook: ServedWebhook, body: bytes, sent: Any = None) -> None:
    answer = webhook.post(body)
    assert answer.status_code in (200, 400), answer.text
    parsed = json.loads(answer.content)
    assert parsed["kind"] == "AdmissionReview"
    response = parsed["response"]
    assert isinstance(response["allowed"], bool)
    assert isinstance(response["status"]["code"], int)
    assert response["status"].get("message") != INTERNAL_ERROR  # no request reaches the edge's catch-all
    assert ("patch" in response) == ("patchType" in response)
    if answer.status_code == 200 and isinstance(sent, dict):
        assert parsed["apiVersion"] == sent["apiVersion"]
        assert response["uid"] == sent["request"]["uid"]


def _child(node: Any, step: str | int) -> Any:
    if isinstance(node, dict):
        return node.get(step, _MISSING)
    if isinstance(node, list) and isinstance(step, int) and step < len(node):
        return node[step]
    return _MISSING


def mutate(document: Json, path: list[str | int], replacement: Any) -> Json:
    """The document with the value at ``path`` (as far as it exists) replaced or deleted."""
    result = copy.deepcopy(document)
    node: Any = result
    for step in path[:-1]:
        node = _child(node, step)
        if node is _MISSING:
            return result
    last = path[-1]
    if isinstance(node, dict):
        if replacement is _DELETE:
            node.pop(last, None)
        else:
            node[last] = replacement
    return result


_MISSING = object()
_DELETE = object()
PATHS: list[list[str | int]] = [
    ["request"],
    ["request", "uid"],
    ["request", "operation"],
    ["request", "object"],
    ["request", "oldObject"],
    ["request", "userInfo"],
    ["request", "userInfo", "username"],
    ["request", "namespace"],
    ["request", "object", "metadata"],
    ["request", "object", "metadata", "annotations"],
    ["request", "object", "spec"],
    ["request", "object", "spec", "containers"],
    ["request", "object", "spec", "containers", 0, "resources"],
    ["request", "object", "spec", "containers", 0, "resources", "limits"],
    ["request", "object", "spec", "containers", 0, "env"],
    ["request", "object", "spec", "containers", 0, "securityContext"],
    ["request", "object", "spec", "initContainers"],
    ["request", "object", "spec", "schedulerName"],
    ["request", "object", "spec", "nodeName"],
    ["request", "object", "kind"],
    ["kind"],
    ["apiVersion"],
]


@FUZZ
@given(body=st.binary(max_size=3000))
def test_arbitrary_bytes_get_400_or_a_review(webhook: ServedWebhook, body: bytes) -> None:
    check_answer(webhook, body)


@FUZZ
@given(value=json_values)
def test_arbitrary_json_gets_400_or_a_review(webhook: ServedWebhook, value: Any) -> None:
    check_answer(webhook, json.dumps(value).encode())


@FUZZ
@given(
    path=st.sampled_from(PATHS),
    replacement=st.one_of(json_values, st.just(_DELETE)),
    operation=st.sampled_from(["CREATE", "UPDATE"]),
)
def test_reviews_with_a_broken_field_get_400_or_a_review(
    webhook: ServedWebhook, path: list[str | int], replacement: Any, operation: str
) -> None:
    base = review(pod(container(limits={GPU: "1"}, env=[{"name": "A", "value": "b"}])), operation=operation)
    if operation == "UPDATE":
        base["request"]["oldObject"] = copy.deepcopy(base["request"]["object"])
    sent = mutate(base, path, replacement)
    check_answer(webhook, json.dumps(sent).encode(), sent)


@FUZZ
@given(
    limits=st.dictionaries(st.sampled_from(RESOURCES), quantities, max_size=5),
    requests=st.dictionaries(st.sampled_from(RESOURCES), quantities, max_size=5),
    init=st.booleans(),
)
def test_pods_with_odd_quantities_get_a_review(
    webhook: ServedWebhook, limits: dict[str, str], requests: dict[str, str], init: bool
) -> None:
    ctr = container(limits=limits, requests=requests)
    sent = review(pod(container(), init=(ctr,)) if init else pod(ctr))
    answer = webhook.post(sent)
    assert answer.status_code == 200, answer.text
    check_answer(webhook, json.dumps(sent).encode(), sent)


def test_server_keeps_serving_after_the_fuzzing(webhook: ServedWebhook) -> None:
    assert webhook.client.get(webhook.url + "/healthz").status_code == 200
    assert webhook.admit(review(pod(container(limits={GPU: "1"}))))["allowed"] is True
