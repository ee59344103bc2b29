"""HAMi's overwriteEnv as deployed (issue 28 item 5), on the real kube-apiserver: the overwrite-env component's
MutatingWebhookConfiguration registered, calling a webhook served with the flag on. A CPU-only pod that sets
NVIDIA_VISIBLE_DEVICES=all is sent to the webhook and stored with NVIDIA_VISIBLE_DEVICES=none; with the flag
alone (base's matchConditions) it was never sent, and kept every GPU of its node under the NVIDIA runtime."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from hami_sim.deployed import deployed_settings
from hami_sim.realk8s import ApiError, ControlPlane, apply, deployed, webhook_configuration
from hami_sim.waiting import eventually_sync
from hami_webhook.settings import WebhookSettings
from tests.webhook.conftest import TlsFiles, offline_settings
from tests.webhook.support import served, write_self_signed

Json = dict[str, Any]
ROOT: Final = Path(__file__).resolve().parents[2]
TENANT: Final = "overwrite-env-tenant"
OVERLAY: Final = """\
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../../base
components:
  - ../../components/overwrite-env
"""


def _cpu_pod(name: str, env: list[Json]) -> Json:
    ctr = {"name": "main", "image": "cuda:12", "env": env, "resources": {"limits": {"cpu": "1"}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": [ctr]}}


def _create(plane: ControlPlane, body: Json) -> Json:
    return plane.request("POST", f"/api/v1/namespaces/{TENANT}/pods?dryRun=All", body)


def _visible(made: Json) -> list[str]:
    (ctr,) = made["spec"]["containers"]
    return [e.get("value", "") for e in ctr.get("env", []) if e["name"] == "NVIDIA_VISIBLE_DEVICES"]


@pytest.fixture(scope="module")
def registered(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    folder = tmp_path_factory.mktemp("overwrite-env")
    # the whole deploy/ folder: the base reaches beside kustomize/ (the dashboard's ConfigMap)
    shutil.copytree(ROOT / "deploy", folder / "deploy")
    tree = folder / "deploy" / "kustomize"
    overlay = tree / "overlays" / "overwrite-env"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(OVERLAY)
    documents = deployed(plane.binaries, base=overlay)
    tls = TlsFiles(folder / "tls.crt", folder / "tls.key")
    write_self_signed(tls.cert, tls.key)
    plane.ensure_namespace(TENANT)
    # the webhook as the component sets it (the flag is read from the rendering, not spelled here); served on
    # loopback, with no apiserver watch or NATS behind it
    offline = offline_settings(tls)
    settings = deployed_settings(
        WebhookSettings,
        "hami-webhook",
        "webhook",
        documents=documents,
        mapped={
            name: getattr(offline, name)
            for name in ("host", "port", "tls_cert_file", "tls_key_file", "watch_cluster", "publish_events", "nats_url")
        },
    )
    assert settings.overwrite_env is True
    with served(settings, tls.cert) as hook:
        config = webhook_configuration(documents, hook.url, tls.cert.read_bytes())
        config["metadata"]["name"] = "hami-webhook-overwrite-env"  # beside any other test's registration
        apply(plane.binaries, plane.write_kubeconfig(folder / "admin"), [config])
        try:

            def called() -> bool:
                try:
                    return _visible(_create(plane, _cpu_pod("probe", []))) == ["none"]
                except ApiError:
                    return False

            eventually_sync(called, what="kube-apiserver calls the registered webhook for a CPU pod")
            yield plane
        finally:
            path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/hami-webhook-overwrite-env"
            plane.request("DELETE", path)


def test_a_cpu_pod_asking_for_every_gpu_is_given_none(registered: ControlPlane) -> None:
    made = _create(registered, _cpu_pod("greedy-cpu", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]))
    # the runtime reads the last value of a name: none
    assert _visible(made)[-1] == "none"
