"""Fixtures of the webhook tests: TLS material and one served webhook shared by a module's tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from hami_webhook.settings import WebhookSettings
from tests.webhook.support import ServedWebhook, served, write_self_signed


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    folder = tmp_path_factory.mktemp("tls")
    files = TlsFiles(folder / "tls.crt", folder / "tls.key")
    write_self_signed(files.cert, files.key)
    return files


def offline_settings(tls: TlsFiles, **overrides: object) -> WebhookSettings:
    """A webhook with TLS and no apiserver or NATS behind it."""
    base: dict[str, object] = {
        "host": "127.0.0.1",
        "port": 0,
        "tls_cert_file": str(tls.cert),
        "tls_key_file": str(tls.key),
        "watch_cluster": False,
        "publish_events": False,
    }
    base.update(overrides)
    return WebhookSettings(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def webhook(tls_files: TlsFiles) -> Iterator[ServedWebhook]:
    with served(offline_settings(tls_files), tls_files.cert) as running:
        yield running
