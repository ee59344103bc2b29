"""Typos named at admission (issue 31 item 4), on the real kube-apiserver and read where a user reads them:
kubectl's ``Warning:`` lines. The deployed MutatingWebhookConfiguration is registered, calling a served
webhook, on the real control plane and on the API emulator; each row of the typo table is created with the
real kubectl against both, and both print the same warnings (or the same refusal). A pod without a typo gets
no warning, and a typo never changes admission: the pod is still routed to our scheduler."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import yaml

from hami_common.annotations import GPU_SCHEDULER_POLICY, USE_GPUTYPE, VGPU_MODE
from hami_common.resources import BAD_QUANTITY, GPU, GPU_CORES, GPU_MEMORY, MAX_CORES
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.realk8s import ApiError, ControlPlane, K8sBinaries, apply, deployed, webhook_configuration
from hami_sim.waiting import eventually_sync
from tests.webhook.conftest import TlsFiles, offline_settings
from tests.webhook.support import container, pod, served, write_self_signed
from tests.webhook.test_typos import TYPO_TABLE

Json = dict[str, Any]
TENANT: Final = "typo-tenant"
CONFIG_NAME: Final = "hami-webhook-typos"  # beside any other test's registration on the shared plane
CONFIGS_PATH: Final = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
SCHEDULER: Final = "hami-scheduler"
WARNING: Final = "Warning: "


class Side:
    """One API server (real or emulated) with the webhook registered, driven by the real kubectl."""

    def __init__(self, name: str, kubectl: str, kubeconfig: Path, home: Path) -> None:
        self.name, self.kubectl_binary, self.kubeconfig, self.home = name, kubectl, kubeconfig, home

    def kubectl(self, manifest: Path, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, HOME=str(self.home))
        env.pop("KUBECONFIG", None)
        return subprocess.run(
            [self.kubectl_binary, "--kubeconfig", str(self.kubeconfig), "-n", TENANT, *args, "-f", str(manifest)],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )


def _manifest(folder: Path, name: str, annotations: dict[str, str], limits: dict[str, str]) -> Path:
    body = pod(container(limits={GPU: "1", **limits}), name=name, namespace=TENANT, annotations=annotations)
    body.pop("status")
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def _warnings(stderr: str) -> list[str]:
    return [line.removeprefix(WARNING) for line in stderr.splitlines() if line.startswith(WARNING)]


@pytest.fixture(scope="module")
def sides(plane: ControlPlane, k8s: K8sBinaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Side]]:
    """[real, emulator], each with the deployed webhook configuration calling one served webhook."""
    folder = tmp_path_factory.mktemp("typos")
    tls = TlsFiles(folder / "tls.crt", folder / "tls.key")
    write_self_signed(tls.cert, tls.key)
    admin = plane.write_kubeconfig(folder / "admin")
    plane.ensure_namespace(TENANT)
    with served(offline_settings(tls), tls.cert) as webhook, KubeApiEmulator() as emulator:
        config = webhook_configuration(deployed(plane.binaries), webhook.url, tls.cert.read_bytes())
        config["metadata"]["name"] = CONFIG_NAME
        apply(plane.binaries, admin, [config])
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT}}
        for path, body in (("/api/v1/namespaces", namespace), (CONFIGS_PATH, config)):
            assert httpx.post(emulator.url + path, json=body).status_code == 201
        made = []
        for name, kubeconfig in (("real", admin), ("emulator", emulator.write_kubeconfig(folder / "emulator"))):
            home = folder / f"home-{name}"
            home.mkdir()
            made.append(Side(name, k8s["kubectl"], kubeconfig, home))
        probe = pod(container(limits={GPU: "1"}), name="probe", namespace=TENANT)
        probe.pop("status")

        def called() -> bool:
            # kube-apiserver reads webhook configurations from an informer: wait until a create sees it
            try:
                made_pod = plane.request("POST", f"/api/v1/namespaces/{TENANT}/pods?dryRun=All", probe)
            except ApiError:
                return False
            return bool(made_pod["spec"]["schedulerName"] == SCHEDULER)

        try:
            eventually_sync(called, what="kube-apiserver calls the registered webhook")
            yield made
        finally:
            plane.request("DELETE", f"{CONFIGS_PATH}/{CONFIG_NAME}")


@pytest.mark.parametrize(("annotations", "limits", "expected"), TYPO_TABLE)
def test_each_typo_is_a_kubectl_warning_and_the_pod_is_admitted_as_before(
    sides: list[Side], tmp_path: Path, annotations: dict[str, str], limits: dict[str, str], expected: str
) -> None:
    manifest = _manifest(tmp_path, "typo", annotations, limits)
    for side in sides:
        done = side.kubectl(manifest, "create", "--dry-run=server", "-o", "yaml")
        assert done.returncode == 0, (side.name, done.stderr)
        assert _warnings(done.stderr) == [expected], (side.name, done.stderr)
        assert yaml.safe_load(done.stdout)["spec"]["schedulerName"] == SCHEDULER, side.name


def test_a_pod_without_a_typo_gets_no_warning(sides: list[Side], tmp_path: Path) -> None:
    clean = {USE_GPUTYPE: "A100", GPU_SCHEDULER_POLICY: "binpack,numa", VGPU_MODE: "hami-core"}
    manifest = _manifest(tmp_path, "clean", clean, {GPU_MEMORY: "1024", GPU_CORES: "30"})
    for side in sides:
        done = side.kubectl(manifest, "create", "--dry-run=server", "-o", "yaml")
        assert done.returncode == 0, (side.name, done.stderr)
        assert _warnings(done.stderr) == [], (side.name, done.stderr)


def test_gpucores_past_100_is_refused_naming_the_resource_and_range(sides: list[Side], tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, "greedy-cores", {}, {GPU_CORES: "150"})
    said = BAD_QUANTITY.format(resource=GPU_CORES, value="150", name="main", why="it is too large", high=MAX_CORES)
    for side in sides:
        done = side.kubectl(manifest, "create", "--dry-run=server")
        assert done.returncode != 0, side.name
        assert said in done.stderr, (side.name, done.stderr)
        assert _warnings(done.stderr) == [], (side.name, done.stderr)


def test_the_typos_of_a_refused_pod_are_printed_with_the_refusal(sides: list[Side], tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, "typo-greedy", {VGPU_MODE: "MIG"}, {GPU_CORES: "150"})
    outputs = []
    for side in sides:
        done = side.kubectl(manifest, "create", "--dry-run=server")
        assert done.returncode != 0, side.name
        assert len(_warnings(done.stderr)) == 1, (side.name, done.stderr)
        outputs.append(done.stderr)
    assert outputs[0] == outputs[1]
