"""The side-by-side component (deploy/kustomize/components/side-by-side) against HAMi's chart v2.10: no object,
scheduler name, webhook name, NodePort or node shared with what ``helm install hami -n kube-system`` creates
(tests/deploy/fixtures/hami-chart-v2.10-objects.yaml), and the in-place base sharing exactly what
docs/migrate-from-hami.md says it shares on purpose."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from hami_common.settings import ENV_PREFIX, env_name, load
from tests.deploy.manifests import NAMESPACE, Rendering, env_of, render_with_component
from tests.deploy.test_settings import FROM_REFERENCE, service_containers, settings_class

Obj = dict[str, Any]
Key = tuple[str, str, str]  # kind, namespace ("" when cluster-scoped), name

FIXTURE: Final = Path(__file__).parent / "fixtures" / "hami-chart-v2.10-objects.yaml"
OURS: Final = "hami-py-scheduler"
OUR_NODES: Final = {"gpu": "hami-py"}
OPT_IN: Final = {"hami-py.io/webhook": "enabled"}


@dataclass(frozen=True, slots=True)
class HamiChart:
    release_namespace: str
    objects: frozenset[Key]
    scheduler_names: frozenset[str]
    webhook_names: frozenset[str]
    node_ports: frozenset[int]
    node_label: dict[str, str]
    namespace_opt_out: dict[str, str]
    service_accounts: tuple[str, ...]

    def objects_in(self, namespace: str) -> frozenset[Key]:
        """The chart's objects as if it were released into ``namespace``."""
        return frozenset((kind, namespace if ns else "", name) for kind, ns, name in self.objects)


@pytest.fixture(scope="module")
def chart() -> HamiChart:
    data = yaml.safe_load(FIXTURE.read_text())
    return HamiChart(
        release_namespace=data["release_namespace"],
        objects=frozenset((kind, ns, name) for kind, ns, name, _template in data["objects"]),
        scheduler_names=frozenset(data["scheduler_names"]),
        webhook_names=frozenset(data["webhook_names"]),
        node_ports=frozenset(data["node_ports"]),
        node_label=data["node_label"],
        namespace_opt_out=data["namespace_opt_out"],
        service_accounts=tuple(data["service_accounts"]),
    )


@pytest.fixture(scope="module", params=["dev", "production"])
def side_by_side(request: pytest.FixtureRequest, kubectl: str, deploy_tree: Path) -> Rendering:
    return render_with_component(deploy_tree, kubectl, request.param, "side-by-side")


# --- what a rendering claims in the cluster ------------------------------------------------------------------


def kube_scheduler_config(rendering: Rendering) -> Obj:
    config: Obj = yaml.safe_load(rendering.get("ConfigMap", "hami-kube-scheduler")["data"]["config.yaml"])
    return config


def objects(rendering: Rendering) -> set[Key]:
    """Every object the rendering creates, and the Lease its kube-scheduler creates at run time."""
    found = {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in rendering.objects}
    election = kube_scheduler_config(rendering)["leaderElection"]
    found.add(("Lease", election["resourceNamespace"], election["resourceName"]))
    return found


def scheduler_names(rendering: Rendering) -> set[str]:
    """The profile kube-scheduler serves, the name the webhook sets and the name the extender binds for."""
    names = {p["schedulerName"] for p in kube_scheduler_config(rendering)["profiles"]}
    for workload, container in (("hami-webhook", "webhook"), ("hami-scheduler", "extender")):
        names.add(env_of(rendering.container(workload, container).container)["HAMI_SCHEDULER_NAME"]["value"])
    return names


def webhooks(rendering: Rendering) -> list[Obj]:
    return [hook for config in rendering.of_kind("MutatingWebhookConfiguration") for hook in config["webhooks"]]


def node_ports(rendering: Rendering) -> set[int]:
    return {p["nodePort"] for s in rendering.of_kind("Service") for p in s["spec"]["ports"] if "nodePort" in p}


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against a namespace's labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        holds = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not holds:
            return False
    return True


def namespace(name: str, **labels: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": name, **labels}


# --- side by side: nothing shared ------------------------------------------------------------------------------


def test_no_object_collides_with_hamis_chart(side_by_side: Rendering, chart: HamiChart) -> None:
    assert chart.release_namespace != NAMESPACE
    assert objects(side_by_side) & chart.objects == set()


def test_hami_released_into_our_namespace_would_collide_exactly_where_the_docs_say(
    side_by_side: Rendering, chart: HamiChart
) -> None:
    # docs/migrate-from-hami.md: HAMi must not be released into hami-system; these would be shared
    always = {
        ("Deployment", NAMESPACE, "hami-scheduler"),
        ("ServiceAccount", NAMESPACE, "hami-scheduler"),
        ("Lease", NAMESPACE, "hami-scheduler"),
    }
    with_replicas = {("PodDisruptionBudget", NAMESPACE, "hami-scheduler")}  # production; HAMi with replicas > 1
    assert always <= objects(side_by_side) & chart.objects_in(NAMESPACE) <= always | with_replicas


def test_one_scheduler_name_of_its_own_everywhere(side_by_side: Rendering, chart: HamiChart) -> None:
    assert scheduler_names(side_by_side) == {OURS}
    assert OURS not in chart.scheduler_names


def test_the_webhook_has_a_name_of_its_own(side_by_side: Rendering, chart: HamiChart) -> None:
    (config,) = side_by_side.of_kind("MutatingWebhookConfiguration")
    assert config["metadata"]["name"] == "hami-py-webhook"
    assert {hook["name"] for hook in webhooks(side_by_side)}.isdisjoint(chart.webhook_names)


def test_the_webhook_takes_only_the_namespaces_that_opt_in(side_by_side: Rendering, chart: HamiChart) -> None:
    (hook,) = webhooks(side_by_side)
    moved = namespace("team-a", **OPT_IN, **chart.namespace_opt_out)  # as the docs label a namespace we take
    assert selects(hook["namespaceSelector"], moved)
    assert not selects(hook["namespaceSelector"], namespace("team-b"))  # still HAMi's
    assert not selects(hook["namespaceSelector"], namespace("team-c", **chart.namespace_opt_out))  # nobody's
    for system in ("kube-system", NAMESPACE):
        assert not selects(hook["namespaceSelector"], namespace(system, **OPT_IN))
    # HAMi's webhook (namespaceSelector: hami.io/webhook NotIn [ignore]) leaves that namespace alone
    hamis = {
        "matchExpressions": [{"key": k, "operator": "NotIn", "values": [v]} for k, v in chart.namespace_opt_out.items()]
    }
    assert not selects(hamis, moved)


def test_its_nodes_are_never_hamis(side_by_side: Rendering, chart: HamiChart) -> None:
    (daemonset,) = side_by_side.of_kind("DaemonSet")
    selector = daemonset["spec"]["template"]["spec"]["nodeSelector"]
    assert selector == OUR_NODES
    # one label key with another value: a node labelled for one stack cannot be labelled for the other
    assert selector.keys() == chart.node_label.keys()
    assert selector != chart.node_label
    extender = env_of(side_by_side.container("hami-scheduler", "extender").container)
    assert extender["HAMI_NODE_LABEL_SELECTOR"]["value"] == "gpu=hami-py"
    (profile,) = kube_scheduler_config(side_by_side)["profiles"]
    (plugin,) = profile["pluginConfig"]
    assert plugin["name"] == "NodeAffinity"
    terms = plugin["args"]["addedAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["hami-py"]}]}]


def test_no_node_port_is_hamis(side_by_side: Rendering, chart: HamiChart) -> None:
    assert node_ports(side_by_side) & chart.node_ports == set()


def test_hamis_scheduler_and_device_plugin_may_still_write_their_pods_annotations(
    side_by_side: Rendering, chart: HamiChart
) -> None:
    celpy = pytest.importorskip("celpy", reason="cel-python (a CEL interpreter) is not installed")
    policy = side_by_side.get("ValidatingAdmissionPolicy", "hami-scheduler-owned")
    (condition,) = [c for c in policy["spec"]["matchConditions"] if c["name"] == "not-a-hami-system-account"]
    env = celpy.Environment()
    program = env.program(env.compile(condition["expression"]))

    def judged(username: str) -> bool:
        return bool(program.evaluate({"request": celpy.json_to_cel({"userInfo": {"username": username}})}))

    for account in chart.service_accounts:
        assert not judged(account), f"{account} would be refused its own pods' annotations"
    # the webhook's own guard of the same annotations exempts the same accounts, no more
    webhook = env_of(side_by_side.container("hami-webhook", "webhook").container)
    users = set(webhook["HAMI_SYSTEM_USERS"]["value"].split(","))
    assert set(chart.service_accounts) <= users
    assert {u for u in users if not judged(u)} == users
    assert not judged(f"system:serviceaccount:{NAMESPACE}:hami-scheduler")
    assert judged("system:serviceaccount:team-a:default")  # tenants still may not
    assert judged("kubernetes-admin")


def test_the_kube_scheduler_config_is_the_bases_but_for_the_profile(
    side_by_side: Rendering, renderings: dict[str, Rendering]
) -> None:
    ours = kube_scheduler_config(side_by_side)
    base = kube_scheduler_config(renderings["base"])
    assert {k: v for k, v in ours.items() if k != "profiles"} == {k: v for k, v in base.items() if k != "profiles"}
    (profile,) = ours["profiles"]
    assert {k: v for k, v in profile.items() if k != "pluginConfig"} == {"schedulerName": OURS}


def test_each_service_accepts_the_components_settings(side_by_side: Rendering) -> None:
    for ref, command in service_containers(side_by_side):
        cls = settings_class(command)
        known = {env_name(f.name) for f in dataclasses.fields(cls)}
        env = {
            n: str(e.get("value", FROM_REFERENCE)) for n, e in env_of(ref.container).items() if n.startswith(ENV_PREFIX)
        }
        assert set(env) <= known, ref.where
        settings: Any = load(cls, [], env=env)
        if command in ("hami-webhook", "hami-extender"):
            assert settings.scheduler_name == OURS


# --- in place: shared on purpose -------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay_name", ["dev", "production"])
def test_in_place_the_base_shares_with_hami_exactly_what_replacing_it_needs(
    renderings: dict[str, Rendering], chart: HamiChart, overlay_name: str
) -> None:
    rendering = renderings[overlay_name]
    # docs/migrate-from-hami.md, "In place": the webhook configuration replaces HAMi's, the scheduler name and
    # the webhook name stay, so pods HAMi's webhook already mutated are scheduled by this one
    assert objects(rendering) & chart.objects == {("MutatingWebhookConfiguration", "", "hami-webhook")}
    assert scheduler_names(rendering) == set(chart.scheduler_names)
    assert {hook["name"] for hook in webhooks(rendering)} == set(chart.webhook_names)
    (daemonset,) = rendering.of_kind("DaemonSet")
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == chart.node_label
    assert node_ports(rendering) & chart.node_ports == set()
