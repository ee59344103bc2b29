"""Issue 28 item 9: with a client CA (``--tls-client-ca-file``) only the apiserver gets past the TLS handshake.

Where kube-apiserver presents a client certificate to webhooks (an AdmissionConfiguration whose
WebhookAdmissionConfiguration names a kubeConfigFile, docs/deploy.md), a review without that certificate
is refused before any byte of it is read. Real handshakes against the served webhook.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import httpx
import pytest

from hami_common.errors import InvalidInput
from hami_sim.tls import CertificateAuthority
from hami_webhook.app import create_app
from hami_webhook.server import serve
from tests.webhook.conftest import TlsFiles, offline_settings
from tests.webhook.support import container, pod, review, served


def test_with_a_client_ca_only_a_certificate_it_signed_gets_a_review_answered(tmp_path: Path) -> None:
    ca = CertificateAuthority(tmp_path / "ca")
    serving = ca.serving("webhook", ("127.0.0.1",))
    apiserver = ca.client("apiserver", "kube-apiserver")
    stranger = CertificateAuthority(tmp_path / "other", name="another CA").client("stranger", "kube-apiserver")
    settings = offline_settings(TlsFiles(serving.cert, serving.key), tls_client_ca_file=str(ca.cert_file))
    with served(settings, serving.ca, client_cert=(apiserver.cert, apiserver.key)) as webhook:
        assert webhook.admit(review(pod(container())))["allowed"] is True
        body = review(pod(container(), namespace="kube-system"))
        for client in (None, stranger):
            verify = ssl.create_default_context(cafile=str(serving.ca))
            if client is not None:
                verify.load_cert_chain(str(client.cert), str(client.key))
            with httpx.Client(verify=verify, timeout=10) as forger, pytest.raises(httpx.TransportError):
                forger.post(webhook.url + "/webhook", json=body)  # refused in the handshake: no answer at all
        assert webhook.admit(review(pod(container())))["allowed"] is True, "the refusals cost the apiserver nothing"


async def test_a_client_ca_without_a_serving_certificate_is_a_clear_error(tls_files: TlsFiles) -> None:
    settings = offline_settings(tls_files, tls_cert_file="", tls_key_file="", tls_client_ca_file="/etc/ca.crt")
    with pytest.raises(InvalidInput, match="needs --tls-cert-file"):
        await serve(create_app(settings), settings, asyncio.Event())


async def test_an_unreadable_client_ca_is_a_clear_error(tls_files: TlsFiles, tmp_path: Path) -> None:
    settings = offline_settings(tls_files, tls_client_ca_file=str(tmp_path / "missing.crt"))
    with pytest.raises(InvalidInput, match="cannot load the client CA"):
        await serve(create_app(settings), settings, asyncio.Event())
