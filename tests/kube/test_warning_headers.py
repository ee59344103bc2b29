"""Webhook warnings reach the emulator's client as kube-apiserver sends them: ``Warning: 299 - "<text>"``
headers, for allowed and refused creates alike (issue 31 item 4). The real apiserver's side, with kubectl,
is tests/realk8s/test_typo_warnings.py."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import yaml

from hami_common.annotations import GPU_SCHEDULER_POLICY
from hami_common.resources import GPU
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.kubeapi._warnings import TRUNCATE_AT_TOTAL, TRUNCATE_ITEM, WarningRecorder
from hami_sim.tls import CertificateAuthority
from tests.kube.conftest import pod_body
from tests.webhook.conftest import TlsFiles, offline_settings
from tests.webhook.support import served

DEPLOYED: Final = Path(__file__).resolve().parents[2] / "deploy/kustomize/base/webhook/mutatingwebhook.yaml"
CONFIGS_PATH: Final = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
TYPO: Final = "unknown annotation nvidia.com/use-gputyp; did you mean nvidia.com/use-gputype?"


def recorded(*texts: str) -> list[str]:
    recorder = WarningRecorder()
    for text in texts:
        recorder.add(text)
    return recorder.headers


@pytest.mark.parametrize(
    ("texts", "headers"),
    [
        pytest.param(("a", "b"), ['299 - "a"', '299 - "b"'], id="one header each, in order"),
        pytest.param(("a", "a", ""), ['299 - "a"'], id="a repeated or empty text is dropped"),
        pytest.param(('say "hi" \\ bye',), ['299 - "say \\"hi\\" \\\\ bye"'], id="quotes and backslashes escaped"),
        pytest.param(("bad\nline", "ok"), ['299 - "ok"'], id="a text with a control character makes no header"),
        pytest.param(("\ud800",), [], id="a text that is no UTF-8 makes no header"),
        pytest.param(("ünïcødé",), ['299 - "ünïcødé"'], id="unicode is kept"),
    ],
)
def test_texts_become_headers_as_kube_apiserver_writes_them(texts: tuple[str, ...], headers: list[str]) -> None:
    assert recorded(*texts) == headers


def test_past_the_total_every_text_is_cut_and_written_again_up_to_the_total() -> None:
    texts = [f"{i:03d}" + "x" * 600 for i in range(20)]
    assert sum(map(len, texts[:6])) <= TRUNCATE_AT_TOTAL < sum(map(len, texts[:7]))  # the 7th passes the total
    cut = [f'299 - "{text[:TRUNCATE_ITEM]}"' for text in texts]
    # from then on every text counts 256 characters: 16 of them reach the total, and the rest are dropped
    assert recorded(*texts) == cut[: TRUNCATE_AT_TOTAL // TRUNCATE_ITEM]
    assert recorded(*texts[:10]) == cut[:10]
    assert recorded(*texts[:6]) == [f'299 - "{text}"' for text in texts[:6]]


def test_the_utf8_bytes_go_out_unchanged() -> None:
    recorder = WarningRecorder()
    recorder.add("é")
    (value,) = recorder.latin1()
    assert value.encode("latin-1") == '299 - "é"'.encode()


# --- HAMi's webhook registered in the emulator as deployed -----------------------------------------------------


@pytest.fixture
def registered(emulator: KubeApiEmulator, tmp_path: Path) -> Iterator[KubeApiEmulator]:
    ca = CertificateAuthority(tmp_path / "webhook-ca")
    tls = ca.serving("webhook", ("127.0.0.1",))
    with served(offline_settings(TlsFiles(tls.cert, tls.key)), ca.cert_file) as running:
        deployed = yaml.safe_load(DEPLOYED.read_text())
        for hook in deployed["webhooks"]:
            path = hook["clientConfig"]["service"].get("path", "/webhook")
            hook["clientConfig"] = {"url": running.url + path, "caBundle": base64.b64encode(ca.pem).decode()}
        assert httpx.post(f"{emulator.url}{CONFIGS_PATH}", json=deployed).status_code == 201
        yield emulator


def _gpu_pod(name: str, annotations: dict[str, str], **security: Any) -> dict[str, Any]:
    body = pod_body(name)
    body["metadata"]["annotations"] = annotations
    ctr = body["spec"]["containers"][0]
    ctr["resources"] = {"limits": {GPU: "1"}}
    if security:
        ctr["securityContext"] = security
    return body


def _create(emulator: KubeApiEmulator, body: dict[str, Any], query: str = "") -> httpx.Response:
    return httpx.post(f"{emulator.url}/api/v1/namespaces/default/pods{query}", json=body)


def test_an_admitted_pods_typos_come_back_as_warning_headers(registered: KubeApiEmulator) -> None:
    made = _create(registered, _gpu_pod("typo", {"nvidia.com/use-gputyp": "A100", GPU_SCHEDULER_POLICY: "spread"}))
    assert made.status_code == 201
    assert made.headers.get_list("Warning") == [f'299 - "{TYPO}"']
    assert made.json()["spec"]["schedulerName"] == "hami-scheduler"  # admitted as before


def test_a_refused_pod_and_a_dry_run_carry_them_too(registered: KubeApiEmulator) -> None:
    refused = _create(registered, _gpu_pod("priv", {"nvidia.com/use-gputyp": "x"}, privileged=True))
    assert refused.status_code == 403
    assert refused.headers.get_list("Warning") == [f'299 - "{TYPO}"']
    dry = _create(registered, _gpu_pod("dry", {"nvidia.com/use-gputyp": "x"}), "?dryRun=All")
    assert dry.status_code == 201
    assert dry.headers.get_list("Warning") == [f'299 - "{TYPO}"']


def test_a_pod_without_typos_gets_no_warning_header(registered: KubeApiEmulator) -> None:
    made = _create(registered, _gpu_pod("clean", {GPU_SCHEDULER_POLICY: "binpack"}))
    assert made.status_code == 201
    assert "Warning" not in made.headers
