"""Fixtures of the webhook tests: TLS material, one served webhook shared by a module's tests, the kube emulator."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from hami_sim.kubeapi import KubeApiEmulator
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


# --- the Kubernetes API emulator (the pattern of tests/kube/conftest.py) ----------------------------------


@pytest.fixture
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator(bookmark_interval=0.2) as api:
        yield api


@pytest.fixture
def kubeconfig(emulator: KubeApiEmulator, tmp_path: Path) -> Path:
    return emulator.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def core(kubeconfig: Path) -> Iterator[Any]:
    """The official client's CoreV1Api, configured from the emulator's kubeconfig."""
    with config.new_client_from_config(str(kubeconfig)) as api:  # type: ignore[no-untyped-call]
        yield client.CoreV1Api(api)


def cluster_settings(tls: TlsFiles, kubeconfig: Path, **overrides: object) -> WebhookSettings:
    """A webhook with TLS that watches the emulator (quick reconnects), without NATS."""
    values: dict[str, object] = {
        "watch_cluster": True,
        "kubeconfig": str(kubeconfig),
        "kube_timeout": 5.0,
        "kube_watch_seconds": 30,
        "kube_backoff_initial": 0.02,
        "kube_backoff_max": 0.2,
    }
    values.update(overrides)
    return offline_settings(tls, **values)
