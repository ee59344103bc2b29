"""Every overlay renders with ``kubectl kustomize`` and every object is valid Kubernetes."""

from __future__ import annotations

from typing import Any, Final

import kubernetes_validate
import msgspec
import pytest

from tests.deploy.manifests import NAMESPACE, Rendering, env_of

# The newest schemas kubernetes-validate ships, and 1.30, the oldest release with GA matchConditions.
OLDEST_SUPPORTED: Final = "1.30.0"
CLUSTER_SCOPED: Final = frozenset(
    {"Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "PriorityClass"}
)


class IssuerRef(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    kind: str


class PrivateKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    algorithm: str
    size: int
    rotationPolicy: str | None = None  # noqa: N815 (the wire name)


class CertificateSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """cert-manager.io/v1 Certificate, the fields these overlays use (kubernetes-validate has no CRDs)."""

    secretName: str  # noqa: N815
    issuerRef: IssuerRef  # noqa: N815
    isCA: bool = False  # noqa: N815
    commonName: str | None = None  # noqa: N815
    duration: str | None = None
    renewBefore: str | None = None  # noqa: N815
    privateKey: PrivateKey | None = None  # noqa: N815
    usages: list[str] | None = None
    dnsNames: list[str] | None = None  # noqa: N815
    ipAddresses: list[str] | None = None  # noqa: N815


class IssuerSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    selfSigned: dict[str, Any] | None = None  # noqa: N815
    ca: dict[str, str] | None = None


CRD_SPECS: Final[dict[tuple[str, str], type[msgspec.Struct]]] = {
    ("cert-manager.io/v1", "Certificate"): CertificateSpec,
    ("cert-manager.io/v1", "Issuer"): IssuerSpec,
}


def test_base_renders_every_component(renderings: dict[str, Rendering]) -> None:
    base = renderings["base"]
    names = {o["metadata"]["name"] for o in base.workloads()}
    assert names == {"hami-scheduler", "hami-webhook", "hami-nats", "hami-node", "hami-metrics"}


@pytest.mark.parametrize("version", [kubernetes_validate.latest_version(), OLDEST_SUPPORTED])
def test_every_object_is_valid_kubernetes(overlay: Rendering, version: str) -> None:
    errors = []
    for obj in overlay.objects:
        key = (obj["apiVersion"], obj["kind"])
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if key in CRD_SPECS:
            try:
                msgspec.convert(obj["spec"], CRD_SPECS[key])
            except msgspec.ValidationError as err:
                errors.append(f"{where}: {err}")
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            errors.append(f"{where}: {err.message} at {list(err.path)}")
    assert errors == []


def test_every_namespaced_object_lands_in_hami_system(overlay: Rendering) -> None:
    misplaced = [
        f"{o['kind']}/{o['metadata']['name']}"
        for o in overlay.objects
        if o["kind"] not in CLUSTER_SCOPED
        and o["metadata"].get("namespace") != NAMESPACE
        # the one exception: reading kube-system's authentication ConfigMap (kube-scheduler's secure port)
        and not (o["kind"] == "RoleBinding" and o["metadata"].get("namespace") == "kube-system")
    ]
    assert misplaced == []


def test_every_secret_and_configmap_reference_resolves(overlay: Rendering) -> None:
    """A missing Secret or key leaves a pod in CreateContainerConfigError: catch it here."""
    secrets = {o["metadata"]["name"]: set(o.get("data", {})) for o in overlay.of_kind("Secret")}
    for cert in overlay.of_kind("Certificate"):  # cert-manager writes these Secrets
        secrets[cert["spec"]["secretName"]] = {"tls.crt", "tls.key", "ca.crt"}
    configmaps = {o["metadata"]["name"] for o in overlay.of_kind("ConfigMap")}
    dangling = []
    for ref in overlay.containers():
        for entry in env_of(ref.container).values():
            key_ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if key_ref and key_ref["key"] not in secrets.get(key_ref["name"], set()):
                dangling.append(f"{ref.where}: {entry['name']} -> {key_ref['name']}/{key_ref['key']}")
        for source in ref.container.get("envFrom") or []:
            if "configMapRef" in source and source["configMapRef"]["name"] not in configmaps:
                dangling.append(f"{ref.where}: envFrom {source['configMapRef']['name']}")
    for workload, pod in overlay.pod_specs():
        for volume in pod.get("volumes") or []:
            if "secret" in volume and volume["secret"]["secretName"] not in secrets:
                dangling.append(f"{workload['metadata']['name']}: volume {volume['secret']['secretName']}")
            if "configMap" in volume and volume["configMap"]["name"] not in configmaps:
                dangling.append(f"{workload['metadata']['name']}: volume {volume['configMap']['name']}")
    assert dangling == []


def test_every_workload_runs_under_its_own_service_account(overlay: Rendering) -> None:
    accounts = {o["metadata"]["name"] for o in overlay.of_kind("ServiceAccount")}
    used = [pod.get("serviceAccountName") for _, pod in overlay.pod_specs()]
    assert None not in used
    assert len(used) == len(set(used)), "two workloads share a ServiceAccount"
    assert set(used) <= accounts


def test_every_service_reaches_a_named_container_port(overlay: Rendering) -> None:
    for service in overlay.of_kind("Service"):
        selector = service["spec"]["selector"]
        pods = [
            pod
            for workload, pod in overlay.pod_specs()
            if selector.items() <= workload["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert pods, f"Service {service['metadata']['name']} selects no pod"
        port_names = {p.get("name") for pod in pods for c in pod["containers"] for p in c.get("ports") or []}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, f"{service['metadata']['name']}: {port['targetPort']}"


def test_every_pod_reaches_nats_at_a_service_that_exists(overlay: Rendering) -> None:
    services = {o["metadata"]["name"] for o in overlay.of_kind("Service")}
    for ref in overlay.containers():
        url = env_of(ref.container).get("HAMI_NATS_URL")
        if url is None:
            continue
        host = url["value"].removeprefix("tls://").split(":")[0].split(".")[0]
        if host == "127" and ref.workload["metadata"]["name"] == "hami-nats":
            continue  # the auth callout beside nats-server, over the pod's loopback
        assert host in services, ref.where
