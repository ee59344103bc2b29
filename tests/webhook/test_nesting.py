"""JSON nested past the decoder's recursion limit (issue 16 item 10): msgspec raises RecursionError even for a
value it only skips. The webhook answers it as malformed input: with the request's uid when it can find it
(so the apiserver reads this webhook's 400, not a broken webhook), else with HTTP 400, and keeps serving."""

from __future__ import annotations

import json
from typing import Final

import pytest

from hami_common.resources import GPU
from tests.webhook.support import ServedWebhook, container, pod, response_of, review

UID: Final = "0f3c1c8e-deep-4e8b-9b56-000000000001"
DEEP: Final = 100_000  # past any recursion limit a library might have raised (Python's default is 1,000)


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def gpu_review() -> str:
    return json.dumps(review(pod(container(limits={GPU: "1"})), uid=UID))


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            gpu_review().replace('"restartPolicy"', f'"padding": {deep(DEEP)}, "restartPolicy"'),
            id="nested deep inside the pod",
        ),
        pytest.param(
            gpu_review().replace(f'"uid": "{UID}"', f'"uid": "{UID}", "padding": {deep(DEEP)}'),
            id="nested deep inside the request",
        ),
    ],
)
def test_deep_nesting_is_refused_as_bad_input_with_the_request_uid(webhook: ServedWebhook, body: str) -> None:
    answer = webhook.post(body.encode())
    assert answer.status_code == 200
    response = response_of(answer.content)
    assert response["uid"] == UID
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "recursion" in response["status"]["message"]
    assert webhook.admit(review(pod(container(limits={GPU: "1"}))))["allowed"] is True


def test_deep_nesting_before_the_uid_is_http_400(webhook: ServedWebhook) -> None:
    """No uid within reach: nothing to address an AdmissionReview to, so the transport says 400."""
    body = '{"padding": ' + deep(DEEP) + ", " + gpu_review()[1:]
    answer = webhook.post(body.encode())
    assert answer.status_code == 400
    assert json.loads(answer.content)["response"]["status"]["code"] == 400
    assert webhook.admit(review(pod(container(limits={GPU: "1"}))))["allowed"] is True
