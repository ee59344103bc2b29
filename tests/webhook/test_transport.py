"""The AdmissionReview transport (k8s-interfaces §3.1): versions, uid, patch encoding, HTTP errors."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from hami_common.resources import GPU
from hami_webhook.review import ADMISSION_V1, ADMISSION_V1BETA1
from tests.webhook.support import ServedWebhook, container, pod, response_of, review


@pytest.mark.parametrize("version", [ADMISSION_V1, ADMISSION_V1BETA1])
def test_response_echoes_api_version_kind_and_uid(webhook: ServedWebhook, version: str) -> None:
    answer = webhook.post(review(pod(container(limits={GPU: "1"})), api_version=version, uid="uid-42"))
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    body = json.loads(answer.content)
    assert (body["apiVersion"], body["kind"]) == (version, "AdmissionReview")
    assert body["response"]["uid"] == "uid-42"
    assert body["response"]["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(body["response"]["patch"]))
    assert {"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"} in ops


def test_query_string_is_ignored(webhook: ServedWebhook) -> None:
    plain = webhook.post(review(pod(container(limits={GPU: "1"}))), path="/webhook")
    with_timeout = webhook.post(review(pod(container(limits={GPU: "1"}))), path="/webhook?timeout=30s&x=y")
    assert response_of(plain.content) == response_of(with_timeout.content)


UPSTREAM_REVIEWS = ["admission.k8s.io.v1.AdmissionReview.json", "admission.k8s.io.v1beta1.AdmissionReview.json"]


@pytest.mark.parametrize("fixture", UPSTREAM_REVIEWS)
def test_upstream_review_is_answered_in_its_own_version_with_its_uid(
    webhook: ServedWebhook, shared_fixtures: Path, fixture: str
) -> None:
    sent = json.loads((shared_fixtures / "k8s" / fixture).read_text())
    answer = webhook.post((shared_fixtures / "k8s" / fixture).read_bytes())
    assert answer.status_code == 200
    body = json.loads(answer.content)
    assert body["apiVersion"] == sent["apiVersion"]
    # "operationValue" is no operation the webhook judges, but its object is a CustomType, not a Pod: HAMi
    # decodes the pod before anything else and answers Errored(400), so the request is refused, not waved on.
    response = body["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "CustomType" in response["status"]["message"]


@pytest.mark.parametrize("fixture", UPSTREAM_REVIEWS)
def test_upstream_create_of_a_custom_object_is_errored_400(
    webhook: ServedWebhook, shared_fixtures: Path, fixture: str
) -> None:
    sent = json.loads((shared_fixtures / "k8s" / fixture).read_text())
    sent["request"]["operation"] = "CREATE"
    response = webhook.admit(sent)
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "CustomType" in response["status"]["message"]


def test_upstream_full_field_pod_is_decoded_and_judged(webhook: ServedWebhook, shared_fixtures: Path) -> None:
    full_pod = json.loads((shared_fixtures / "k8s" / "core.v1.Pod.json").read_text())
    response = webhook.admit(review(full_pod))
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert isinstance(response["allowed"], bool)


def test_wrong_content_type_is_http_200_with_a_400_status_as_controller_runtime_answers(
    webhook: ServedWebhook,
) -> None:
    answer = webhook.post(review(pod()), headers={"content-type": "text/plain"})
    assert answer.status_code == 200
    response = response_of(answer.content)
    assert response["allowed"] is False
    assert response["status"] == {"code": 400, "message": "contentType=text/plain, expected application/json"}


def test_body_over_the_limit_is_http_400(webhook: ServedWebhook) -> None:
    huge = review(pod(container(env=[{"name": "PAD", "value": "x" * (8 * 1024 * 1024)}])))
    answer = webhook.post(huge)
    assert answer.status_code == 400
    assert "larger than" in response_of(answer.content)["status"]["message"]


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}',
        b'{"apiVersion":"admission.k8s.io/v2","kind":"AdmissionReview","request":{"uid":"x"}}',
        b'{"apiVersion":"v1","kind":"Pod"}',
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}',
    ],
    ids=["empty", "not json", "a list", "no request", "unknown version", "a pod, not a review", "no uid"],
)
def test_unreadable_envelope_is_http_400_with_a_review_that_says_why(webhook: ServedWebhook, body: bytes) -> None:
    answer = webhook.post(body)
    assert answer.status_code == 400
    response = response_of(answer.content)
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert response["status"]["message"]


def test_health_and_readiness_without_caches(webhook: ServedWebhook) -> None:
    assert webhook.client.get(webhook.url + "/healthz").status_code == 200
    assert webhook.client.get(webhook.url + "/readyz").status_code == 200
