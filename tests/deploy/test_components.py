"""The pieces fit together: kube-scheduler's extender configuration, RBAC per component, NATS users."""

from __future__ import annotations

from typing import Final

import msgspec
import pytest
import yaml

from hami_common import resources
from tests.deploy.manifests import NAMESPACE, Rendering, env_of
from tests.deploy.natsconf import nats_config_users

# --- kube-scheduler: kubescheduler.config.k8s.io/v1, the fields of k8s-interfaces §2.3 -------------------


class ManagedResource(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    ignoredByScheduler: bool = False  # noqa: N815 (wire names)


class TLSConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    insecure: bool = False
    serverName: str = ""  # noqa: N815
    certFile: str = ""  # noqa: N815
    keyFile: str = ""  # noqa: N815
    caFile: str = ""  # noqa: N815


class Extender(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    urlPrefix: str  # noqa: N815
    filterVerb: str = ""  # noqa: N815
    preemptVerb: str = ""  # noqa: N815
    prioritizeVerb: str = ""  # noqa: N815
    bindVerb: str = ""  # noqa: N815
    weight: int = 0
    enableHTTPS: bool = False  # noqa: N815
    tlsConfig: TLSConfig | None = None  # noqa: N815
    httpTimeout: str = ""  # noqa: N815
    nodeCacheCapable: bool = False  # noqa: N815
    managedResources: list[ManagedResource] = msgspec.field(default_factory=list)  # noqa: N815
    ignorable: bool = False


class LeaderElection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    leaderElect: bool  # noqa: N815
    resourceLock: str = "leases"  # noqa: N815
    resourceName: str = ""  # noqa: N815
    resourceNamespace: str = ""  # noqa: N815


class Profile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    schedulerName: str  # noqa: N815


class SchedulerConfiguration(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    apiVersion: str  # noqa: N815
    kind: str
    leaderElection: LeaderElection  # noqa: N815
    profiles: list[Profile]
    extenders: list[Extender]


HAMI_RESOURCES: Final = {
    resources.GPU,
    resources.GPU_MEMORY,
    resources.GPU_MEMORY_PERCENTAGE,
    resources.GPU_CORES,
    resources.GPU_PRIORITY,
}


@pytest.fixture
def scheduler_config(overlay: Rendering) -> SchedulerConfiguration:
    configmap = overlay.get("ConfigMap", "hami-kube-scheduler")
    return msgspec.convert(yaml.safe_load(configmap["data"]["config.yaml"]), SchedulerConfiguration)


def test_scheduler_config_is_a_v1_kube_scheduler_configuration(scheduler_config: SchedulerConfiguration) -> None:
    assert scheduler_config.apiVersion == "kubescheduler.config.k8s.io/v1"
    assert scheduler_config.kind == "KubeSchedulerConfiguration"


def test_kube_scheduler_calls_the_extender_over_verified_https(
    overlay: Rendering, scheduler_config: SchedulerConfiguration
) -> None:
    (extender,) = scheduler_config.extenders
    assert extender.urlPrefix.startswith("https://127.0.0.1:")
    assert extender.enableHTTPS
    assert extender.tlsConfig is not None
    assert not extender.tlsConfig.insecure
    port = extender.urlPrefix.rsplit(":", 1)[1]
    extender_container = overlay.container("hami-scheduler", "extender").container
    assert env_of(extender_container)["HAMI_HTTP_PORT"]["value"] == port
    scheduler = overlay.container("hami-scheduler", "kube-scheduler").container
    mounts = [m["mountPath"] for m in scheduler["volumeMounts"]]
    assert any(extender.tlsConfig.caFile.startswith(path + "/") for path in mounts)


def test_extender_filters_and_binds_gpu_pods_by_node_name(scheduler_config: SchedulerConfiguration) -> None:
    (extender,) = scheduler_config.extenders
    assert (extender.filterVerb, extender.bindVerb) == ("filter", "bind")
    assert extender.nodeCacheCapable
    assert extender.httpTimeout == "30s"
    assert not extender.ignorable
    managed = {m.name for m in extender.managedResources if m.name in HAMI_RESOURCES}
    assert managed == HAMI_RESOURCES  # the other families' names: tests/deploy/test_vendor_routing.py
    # kube-scheduler counts slices (the device plugin's allocatable) so its preemption can find victims;
    # memory, cores and priority exist on no node's allocatable: only the extender judges them
    counted = {m.name for m in extender.managedResources if not m.ignoredByScheduler and m.name in HAMI_RESOURCES}
    assert counted == {resources.GPU}
    assert extender.preemptVerb == "preempt"


def test_scheduler_name_matches_the_one_the_webhook_sets(
    overlay: Rendering, scheduler_config: SchedulerConfiguration
) -> None:
    webhook = overlay.container("hami-webhook", "webhook").container
    assert [p.schedulerName for p in scheduler_config.profiles] == [env_of(webhook)["HAMI_SCHEDULER_NAME"]["value"]]


def test_kube_scheduler_elects_a_leader_on_a_lease_it_may_write(
    overlay: Rendering, scheduler_config: SchedulerConfiguration
) -> None:
    election = scheduler_config.leaderElection
    assert election.leaderElect
    assert election.resourceLock == "leases"
    assert election.resourceNamespace == NAMESPACE
    role = overlay.get("Role", "hami-scheduler-leases")
    named = [r for r in role["rules"] if "update" in r["verbs"]]
    assert any(election.resourceName in r.get("resourceNames", []) for r in named)


# --- RBAC: k8s-interfaces §4.2 --------------------------------------------------------------------------


def granted(rendering: Rendering, account: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples the ServiceAccount gets through any binding."""
    roles = {
        (r["kind"], r["metadata"]["name"]): r for r in rendering.of_kind("ClusterRole") + rendering.of_kind("Role")
    }
    out: set[tuple[str, str, str]] = set()
    for binding in rendering.of_kind("ClusterRoleBinding") + rendering.of_kind("RoleBinding"):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
            continue
        role = roles.get((binding["roleRef"]["kind"], binding["roleRef"]["name"]))
        for rule in (role or {}).get("rules", []):
            out |= {(g, res, v) for g in rule["apiGroups"] for res in rule["resources"] for v in rule["verbs"]}
    return out


def test_no_role_grants_wildcards_or_secrets(overlay: Rendering) -> None:
    for role in overlay.of_kind("ClusterRole") + overlay.of_kind("Role"):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], role["metadata"]["name"]
            assert "secrets" not in rule["resources"], role["metadata"]["name"]


@pytest.mark.parametrize(
    ("account", "needed"),
    [
        pytest.param(
            "hami-scheduler",
            {("", "pods", "patch"), ("", "pods/binding", "create"), ("", "nodes", "patch"), ("", "events", "create")},
            id="the extender annotates and binds pods, annotates nodes, records events",
        ),
        pytest.param(
            "hami-webhook",
            {("", "resourcequotas", "watch"), ("", "namespaces", "watch")},
            id="the webhook watches quotas and namespaces",
        ),
        pytest.param(
            "hami-node",
            {("", "pods", "patch"), ("", "nodes", "patch"), ("", "pods", "watch")},
            id="the node pod registers devices and finishes allocations",
        ),
    ],
)
def test_each_component_gets_what_its_protocol_needs(
    overlay: Rendering, account: str, needed: set[tuple[str, str, str]]
) -> None:
    assert needed <= granted(overlay, account)


@pytest.mark.parametrize(
    ("account", "forbidden"),
    [
        pytest.param("hami-webhook", "patch", id="the webhook writes nothing through the API"),
        pytest.param("hami-webhook", "create", id="the webhook creates nothing"),
        pytest.param("hami-node", "delete", id="the node pod deletes nothing"),
        pytest.param("hami-scheduler", "delete", id="the scheduler pod deletes nothing"),
    ],
)
def test_components_get_no_verb_they_do_not_use(overlay: Rendering, account: str, forbidden: str) -> None:
    assert not {t for t in granted(overlay, account) if t[2] == forbidden}


@pytest.mark.parametrize(
    ("workload", "grants"),
    [
        ("hami-metrics", set()),
        # the NATS auth callout beside nats-server reviews node tokens, and may do nothing else
        ("hami-nats", {("authentication.k8s.io", "tokenreviews", "create")}),
    ],
)
def test_bus_only_components_get_no_api_token(
    overlay: Rendering, workload: str, grants: set[tuple[str, str, str]]
) -> None:
    pod = next(pod for w, pod in overlay.pod_specs() if w["metadata"]["name"] == workload)
    assert pod["automountServiceAccountToken"] is False
    assert granted(overlay, pod["serviceAccountName"]) == grants


# --- NATS users: one per service, every password from the Secret ----------------------------------------


def test_every_service_connects_to_nats_as_its_own_user(overlay: Rendering) -> None:
    users = nats_config_users()
    seen = {}
    for ref in overlay.containers():
        env = env_of(ref.container)
        if "HAMI_NATS_URL" not in env:
            continue
        assert env["HAMI_NATS_URL"]["value"].startswith("tls://"), ref.where  # TLS on every connection
        assert "HAMI_NATS_CA_FILE" in env, ref.where
        if "HAMI_NATS_TOKEN_FILE" in env:  # a node service: its identity is its node, from the auth callout
            assert env["HAMI_NATS_IDENTITY"]["value"] == "node-$(HAMI_NODE_NAME)", ref.where
            assert "HAMI_NATS_USER" not in env, ref.where
            assert "HAMI_NATS_PASSWORD" not in env, ref.where
            continue
        user = env["HAMI_NATS_USER"]["value"]
        assert env["HAMI_NATS_IDENTITY"]["value"] == user, ref.where  # its own inbox prefix
        assert user in users, ref.where
        assert env["HAMI_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == user, ref.where
        seen[ref.container["name"]] = user
    assert sorted(seen.values()) == sorted(users), "one container per NATS user, and no user unused"


def test_nats_server_gets_every_password_from_the_secret(overlay: Rendering) -> None:
    env = env_of(overlay.container("hami-nats", "nats").container)
    for user, variable in nats_config_users().items():
        assert env[variable]["valueFrom"]["secretKeyRef"]["key"] == user


def test_webhook_trusts_exactly_the_accounts_that_write_pod_annotations(overlay: Rendering) -> None:
    """Scheduler-owned annotations may come only from the system's own writers: the accounts RBAC lets
    patch pods are the ones the webhook lets set them, no more, no fewer."""
    webhook = overlay.container("hami-webhook", "webhook").container
    trusted = set(env_of(webhook)["HAMI_SYSTEM_USERS"]["value"].split(","))
    writers = {
        f"system:serviceaccount:{NAMESPACE}:{account['metadata']['name']}"
        for account in overlay.of_kind("ServiceAccount")
        if ("", "pods", "patch") in granted(overlay, account["metadata"]["name"])
    }
    assert trusted == writers


def test_only_kube_scheduler_in_the_same_pod_reaches_the_extender(
    overlay: Rendering, scheduler_config: SchedulerConfiguration
) -> None:
    """HAMi#3030: the extender listened on 0.0.0.0 with server-only TLS, so anyone who reached it bound pods.
    It listens on the pod's loopback, requires a client certificate of its CA, and kube-scheduler presents
    one; the kubelet probes a port that answers /healthz only."""
    (extender,) = scheduler_config.extenders
    assert extender.tlsConfig is not None
    workload = overlay.get("Deployment", "hami-scheduler")
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    scheduler = overlay.container("hami-scheduler", "kube-scheduler").container
    secret_mounts = {
        m["mountPath"]: volumes[m["name"]]["secret"]["secretName"]
        for m in scheduler["volumeMounts"]
        if "secret" in volumes[m["name"]]
    }
    secrets = {o["metadata"]["name"] for o in overlay.of_kind("Secret")}
    secrets |= {c["spec"]["secretName"] for c in overlay.of_kind("Certificate")}
    for path in (extender.tlsConfig.certFile, extender.tlsConfig.keyFile):
        assert path, "kube-scheduler presents no client certificate"
        folder = path.rsplit("/", 1)[0]
        assert folder in secret_mounts
        assert any(s.startswith(secret_mounts[folder]) for s in secrets)  # generated names carry a hash suffix
    container = overlay.container("hami-scheduler", "extender").container
    env = env_of(container)
    assert env["HAMI_HTTP_HOST"]["value"] == "127.0.0.1"
    assert env["HAMI_TLS_CLIENT_CA_FILE"]["value"] == extender.tlsConfig.caFile
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    assert any(env["HAMI_TLS_CLIENT_CA_FILE"]["value"].startswith(path + "/") for path in mounts)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in (container["livenessProbe"], container["readinessProbe"]):
        assert probe["httpGet"]["path"] == "/healthz"
        assert str(ports[probe["httpGet"]["port"]]) == env["HAMI_HEALTH_PORT"]["value"]
