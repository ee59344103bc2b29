"""Policies over the rendered objects: what an operator or a security review would check by hand."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from hami_common.annotations import WEBHOOK_IGNORE, WEBHOOK_LABEL
from tests.deploy.manifests import DEPLOY, NAMESPACE, REPO_ROOT, Rendering, env_of

Obj = dict[str, Any]

SECRET_NAME: Final = re.compile(r"PASSWORD|PASSWD|TOKEN|SECRET|CREDENTIAL|PRIVATE|(^|_)KEY$")
PEM_BLOCK: Final = re.compile(r"-----BEGIN [A-Z ]+-----")
SOURCE_SUFFIXES: Final = (".yaml", ".yml", ".conf")


def source_files() -> list[Path]:
    """Every committed manifest and config file under deploy/ (generated secrets/ are not sources)."""
    return sorted(
        p for p in DEPLOY.rglob("*") if p.suffix in SOURCE_SUFFIXES and "secrets" not in p.relative_to(DEPLOY).parts
    )


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes label-selector semantics (an absent selector selects everything)."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[op]
        if not ok:
            return False
    return True


def commented(lines: list[str], index: int) -> bool:
    """Whether line ``index`` carries a comment, or the line just above is one."""
    return "#" in lines[index] or (index > 0 and lines[index - 1].strip().startswith("#"))


# --- privilege ------------------------------------------------------------------------------------------


def test_no_container_is_privileged(overlay: Rendering) -> None:
    privileged = [
        ref.where for ref in overlay.containers() if ref.container.get("securityContext", {}).get("privileged")
    ]
    assert privileged == [], "a privileged container needs a comment beside it saying why, and a test exception"


ELEVATED: Final = re.compile(
    r"privileged:\s*true|runAsUser:\s*0\b|host(Network|PID|IPC):\s*true|network_mode:\s*host|user:\s*\"?0[:\"]"
)


def test_every_privileged_or_root_setting_in_the_sources_says_why() -> None:
    """Kustomize sources and docker-compose.yml alike: a comment beside each one says why."""
    unexplained = []
    for path in [*source_files(), REPO_ROOT / "docker-compose.yml"]:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if ELEVATED.search(line) and not commented(lines, i):
                unexplained.append(f"{path.relative_to(REPO_ROOT)}:{i + 1}: {line.strip()}")
    assert unexplained == []


def test_no_container_can_gain_privileges_or_capabilities(overlay: Rendering) -> None:
    for ref in overlay.containers():
        context = ref.container.get("securityContext") or {}
        assert context.get("allowPrivilegeEscalation") is False, ref.where
        assert context.get("capabilities", {}).get("drop") == ["ALL"], ref.where
        assert not context.get("capabilities", {}).get("add"), ref.where
        assert context.get("readOnlyRootFilesystem") is True, ref.where


def test_no_pod_shares_host_namespaces(overlay: Rendering) -> None:
    for workload, pod in overlay.pod_specs():
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.get(field), f"{workload['metadata']['name']}: {field}"


def test_only_the_node_daemonset_runs_as_root(overlay: Rendering) -> None:
    for workload, pod in overlay.pod_specs():
        name = workload["metadata"]["name"]
        if name == "hami-node":
            continue
        assert pod["securityContext"].get("runAsNonRoot") is True, name
        assert pod["securityContext"].get("runAsUser", 0) != 0, name


def test_node_daemonset_mounts_only_the_host_paths_it_needs(overlay: Rendering) -> None:
    daemonset = overlay.get("DaemonSet", "hami-node")
    pod = daemonset["spec"]["template"]["spec"]
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",  # which pod each Allocate is for, asked of the kubelet
        "/var/lib/hami/staging",
        "/usr/local/vgpu",
        "/tmp/vgpulock",
    }
    assert pod["nodeSelector"] == {"gpu": "on"}
    host_volumes = {v["name"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {c["name"]: {m["name"] for m in c["volumeMounts"]} & host_volumes for c in pod["containers"]}
    assert mounts["nodeagent"] == {"staging", "vgpu"}, "the node agent never touches the kubelet's sockets"
    assert mounts["allocator"] == {"device-plugins", "pod-resources", "staging", "vgpu"}
    (pod_resources,) = [m for c in pod["containers"] for m in c["volumeMounts"] if m["name"] == "pod-resources"]
    assert pod_resources.get("readOnly") is True


def test_no_host_path_outside_the_node_daemonset(overlay: Rendering) -> None:
    for workload, pod in overlay.pod_specs():
        if workload["metadata"]["name"] != "hami-node":
            assert not [v for v in pod.get("volumes") or [] if "hostPath" in v], workload["metadata"]["name"]


# --- resources ------------------------------------------------------------------------------------------


def test_every_container_has_requests_and_limits_in_production(production: Rendering) -> None:
    missing = []
    for ref in production.containers():
        resources = ref.container.get("resources") or {}
        for kind in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in (resources.get(kind) or {}):
                    missing.append(f"{ref.where}: {kind}.{resource}")
    assert missing == []


def test_production_runs_replicas_behind_disruption_budgets(production: Rendering) -> None:
    budgets = production.of_kind("PodDisruptionBudget")
    wanted = {
        ("Deployment", "hami-webhook"): 3,
        ("Deployment", "hami-metrics"): 2,
        ("Deployment", "hami-scheduler"): 2,
        ("StatefulSet", "hami-nats"): 3,
    }
    for (kind, name), replicas in wanted.items():
        workload = production.get(kind, name)
        assert workload["spec"]["replicas"] >= replicas
        labels = workload["spec"]["template"]["metadata"]["labels"]
        (budget,) = [b["spec"] for b in budgets if selects(b["spec"]["selector"], labels)]
        # a drain may always evict one pod (a budget allowing none stalls it), and never all of them
        allowed = budget["maxUnavailable"] if "maxUnavailable" in budget else replicas - budget["minAvailable"]
        assert 1 <= allowed < replicas, name
        if kind == "StatefulSet":  # NATS: a JetStream quorum stays
            assert replicas - allowed > replicas // 2, name


# --- exposure -------------------------------------------------------------------------------------------


def test_no_nodeport_or_load_balancer_service(overlay: Rendering) -> None:
    for service in overlay.of_kind("Service"):
        assert service["spec"].get("type", "ClusterIP") == "ClusterIP", service["metadata"]["name"]
        assert all("nodePort" not in port for port in service["spec"]["ports"])


def test_no_container_binds_a_host_port(overlay: Rendering) -> None:
    for ref in overlay.containers():
        assert all("hostPort" not in port for port in ref.container.get("ports") or []), ref.where


def test_ingress_is_denied_by_default_in_the_namespace(overlay: Rendering) -> None:
    policies = overlay.of_kind("NetworkPolicy")
    assert any(p["spec"]["podSelector"] == {} and not p["spec"].get("ingress") for p in policies)


def _nats_ingress(overlay: Rendering) -> list[dict[str, Any]]:
    """The ingress rules of every NetworkPolicy that selects the NATS pods."""
    nats_labels = overlay.get("StatefulSet", "hami-nats")["spec"]["template"]["metadata"]["labels"]
    return [
        rule
        for p in overlay.of_kind("NetworkPolicy")
        if p["spec"]["podSelector"] and selects(p["spec"]["podSelector"], nats_labels)
        for rule in p["spec"].get("ingress") or []
    ]


def _nats_port(overlay: Rendering, name: str) -> int:
    """The NATS container's port of that name (``client``: what the services connect to)."""
    ref = overlay.container("hami-nats", "nats")
    (port,) = [p["containerPort"] for p in ref.container.get("ports") or [] if p.get("name") == name]
    return int(port)


def _opens(rule: dict[str, Any], port: int) -> bool:
    return not rule.get("ports") or any(p.get("port") == port for p in rule["ports"])


def test_nats_admits_only_the_hami_services(overlay: Rendering) -> None:
    rules = [rule for rule in _nats_ingress(overlay) if _opens(rule, _nats_port(overlay, "client"))]
    callers = {"hami-scheduler", "hami-webhook", "hami-node", "hami-metrics"}
    for workload, _ in overlay.pod_specs():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        admitted = any(
            any(
                "podSelector" in peer and "namespaceSelector" not in peer and selects(peer["podSelector"], labels)
                for peer in rule.get("from") or []
            )
            for rule in rules
        )
        assert admitted == (workload["metadata"]["name"] in callers), workload["metadata"]["name"]
    assert all(rule.get("from") for rule in rules), "a NATS rule without 'from' admits every pod"


def test_the_production_nats_servers_reach_each_other_only_on_the_route_port(production: Rendering) -> None:
    cluster = production.get("ConfigMap", "hami-nats")["data"]["cluster.conf"]
    (listen,) = re.findall(r"listen:\s*[\d.]+:(\d+)", cluster)
    route_port = int(listen)
    nats_labels = production.get("StatefulSet", "hami-nats")["spec"]["template"]["metadata"]["labels"]

    def from_nats(rule: dict[str, Any]) -> bool:
        peers = rule.get("from") or []
        return any("namespaceSelector" not in p and selects(p.get("podSelector"), nats_labels) for p in peers)

    rules = _nats_ingress(production)
    assert any(from_nats(rule) and _opens(rule, route_port) for rule in rules), "no policy admits the routes"
    for rule in rules:
        if from_nats(rule):
            assert [p["port"] for p in rule.get("ports") or []] == [route_port], rule
        if _opens(rule, route_port):
            assert rule.get("from"), "the route port is open to every pod"
            for workload, _ in production.pod_specs():
                labels = workload["spec"]["template"]["metadata"]["labels"]
                admitted = any(selects(p.get("podSelector"), labels) for p in rule["from"] if "podSelector" in p)
                assert admitted == (labels == nats_labels), workload["metadata"]["name"]


# --- secrets --------------------------------------------------------------------------------------------


def test_no_secret_literal_in_the_sources() -> None:
    findings = []
    for path in source_files():
        text = path.read_text()
        where = str(path.relative_to(DEPLOY))
        if PEM_BLOCK.search(text):
            findings.append(f"{where}: PEM block")
        if re.search(r"^kind:\s*Secret\s*$", text, re.MULTILINE):
            findings.append(f"{where}: a Secret object (use a secretGenerator over generated files)")
        if re.search(r"^\s*(stringData|certData|keyData|token):", text, re.MULTILINE):
            findings.append(f"{where}: inline secret field")
        if re.search(r"^\s*caBundle:\s*\S{20,}", text, re.MULTILINE):
            findings.append(f"{where}: inline caBundle (inject it, or fill a placeholder at apply time)")
        if path.suffix == ".conf":
            for match in re.finditer(r"^\s*(password|token|nkey)\s*:\s*(\S+)", text, re.MULTILINE):
                if not match.group(2).startswith("$"):
                    findings.append(f"{where}: {match.group(1)} is not a variable reference")
    assert findings == []


def test_secret_values_reach_containers_only_by_reference(overlay: Rendering) -> None:
    literal = [
        f"{ref.where}: {name}"
        for ref in overlay.containers()
        for name, entry in env_of(ref.container).items()
        if SECRET_NAME.search(name) and not name.endswith("_FILE") and "value" in entry
    ]
    assert literal == []


def test_every_rendered_secret_comes_from_a_generator(overlay: Rendering) -> None:
    """Generated Secrets carry kustomize's content-hash suffix; a hand-written one would not."""
    for secret in overlay.of_kind("Secret"):
        assert re.fullmatch(r"[a-z0-9-]+-[a-z0-9]{10}", secret["metadata"]["name"]), secret["metadata"]["name"]


# --- the webhook ----------------------------------------------------------------------------------------


def webhooks(rendering: Rendering) -> list[Obj]:
    return [
        hook
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
        for config in rendering.of_kind(kind)
        for hook in config["webhooks"]
    ]


def namespace_labels(name: str, **extra: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name, **extra}


def test_webhook_never_gates_kube_system(overlay: Rendering) -> None:
    hooks = webhooks(overlay)
    assert hooks
    for hook in hooks:
        assert not selects(hook.get("namespaceSelector"), namespace_labels("kube-system")), hook["name"]


def test_webhook_never_gates_its_own_namespace(overlay: Rendering) -> None:
    namespace = overlay.get("Namespace", NAMESPACE)
    for hook in webhooks(overlay):
        assert not selects(hook.get("namespaceSelector"), namespace["metadata"]["labels"]), hook["name"]


@pytest.mark.parametrize(
    ("labels", "gated"),
    [
        pytest.param(namespace_labels("team-a"), True, id="an ordinary namespace is gated"),
        pytest.param(namespace_labels("team-b", **{WEBHOOK_LABEL: WEBHOOK_IGNORE}), False, id="opted-out namespace"),
    ],
)
def test_webhook_gates_ordinary_namespaces_unless_opted_out(
    overlay: Rendering, labels: dict[str, str], gated: bool
) -> None:
    for hook in webhooks(overlay):
        assert selects(hook.get("namespaceSelector"), labels) == gated


def test_webhook_fails_closed_only_for_pods_it_selects(overlay: Rendering) -> None:
    for hook in webhooks(overlay):
        assert hook["failurePolicy"] == "Fail"
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"][0] == "v1"
        assert hook["matchConditions"], "matchConditions keep non-GPU pods away from a fail-closed webhook"
        assert 1 <= hook["timeoutSeconds"] <= 30
        assert {"pods"} <= {r for rule in hook["rules"] for r in rule["resources"]}


TENANT_LABELS: Final = [
    pytest.param({}, id="an unlabelled pod"),
    pytest.param({WEBHOOK_LABEL: WEBHOOK_IGNORE}, id="a pod labelled with the namespace opt-out"),
    pytest.param({WEBHOOK_LABEL: "off", "app": "x"}, id="a pod with any other labels"),
]


@pytest.mark.parametrize("labels", TENANT_LABELS)
def test_no_label_a_pod_author_sets_keeps_the_pod_from_the_webhook(overlay: Rendering, labels: dict[str, str]) -> None:
    """A pod's labels are its author's: an objectSelector opt-out let a tenant keep forged scheduler-owned
    annotations (issue 16 item 1, HAMi#3041). Only namespace labels, which tenants cannot set, may exclude."""
    for hook in webhooks(overlay):
        assert selects(hook.get("objectSelector"), labels), hook["name"]


@pytest.mark.parametrize("labels", TENANT_LABELS)
def test_the_compose_webhook_has_no_pod_level_opt_out(labels: dict[str, str]) -> None:
    (config,) = yaml.safe_load_all((DEPLOY / "compose" / "webhook.yaml").read_text())
    for hook in config["webhooks"]:
        assert selects(hook.get("objectSelector"), labels), hook["name"]


def test_dev_ca_bundle_verifies_the_webhook_certificate(dev: Rendering) -> None:
    (hook,) = webhooks(dev)
    ca = x509.load_pem_x509_certificate(base64.b64decode(hook["clientConfig"]["caBundle"]))
    secret = dev.get("Secret", "hami-webhook-tls")
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    service = hook["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in names
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)


def test_production_ca_bundle_comes_from_cert_manager(production: Rendering) -> None:
    config = production.get("MutatingWebhookConfiguration", "hami-webhook")
    (hook,) = config["webhooks"]
    injected = config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    namespace, name = injected.split("/")
    certificate = production.get("Certificate", name)
    assert namespace == NAMESPACE
    service = hook["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in certificate["spec"]["dnsNames"]
    volumes = production.get("Deployment", "hami-webhook")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "webhook-tls", "secret": {"secretName": certificate["spec"]["secretName"]}} in volumes


# --- metrics (issue 16 item 10) ------------------------------------------------------------------------------


def test_metrics_require_a_bearer_token_from_a_generated_secret(overlay: Rendering) -> None:
    deployment = overlay.get("Deployment", "hami-metrics")
    pod_spec = deployment["spec"]["template"]["spec"]
    (ctr,) = [c for c in pod_spec["containers"] if c["name"] == "metrics"]
    token_file = env_of(ctr)["HAMI_METRICS_TOKEN_FILE"]["value"]
    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    (volume,) = [v for v in pod_spec["volumes"] if "secret" in v and token_file.startswith(mounts.get(v["name"], "-"))]
    secret = overlay.get("Secret", "hami-metrics-token")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    key = token_file.removeprefix(mounts[volume["name"]]).strip("/")
    assert len(base64.b64decode(secret["data"][key])) >= 32, "a generated token, not an empty one"


def test_metrics_are_scraped_only_from_the_monitoring_namespace(overlay: Rendering) -> None:
    """A pod label is its author's: the scraper is chosen by a namespace label nobody can set."""
    policy = overlay.get("NetworkPolicy", "hami-metrics")
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule.get("from") or [{}]]
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    for peer in peers:
        assert "ipBlock" not in peer
        tenant_namespace = selects(peer.get("namespaceSelector"), namespace_labels("team-a"))
        assert not (tenant_namespace and selects(peer.get("podSelector"), prometheus)), peer
    assert any(selects(peer.get("namespaceSelector"), namespace_labels("monitoring")) for peer in peers)
