"""Mutating admission webhooks in the emulator: configurations served as an API, and called on pod create as
kube-apiserver calls them (the same behaviour is compared with the real one in
tests/realk8s/test_emulator_agrees.py)."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.tls import CertificateAuthority
from tests.kube.conftest import pod_body
from tests.kube.hookserver import MUTATED, HookServer, closed_port, hook_server, webhook
from tests.webhook.conftest import TlsFiles, offline_settings
from tests.webhook.support import served

CONFIG: Final = "diff"
MODES: Final = ("patch", "deny", "deny-code", "bad-patch")
CONFIGS_PATH: Final = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
DEPLOYED: Final = Path(__file__).resolve().parents[2] / "deploy/kustomize/base/webhook/mutatingwebhook.yaml"


def status_of(err: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(err.body or "{}")
    return body


def moded(name: str, mode: str, namespace: str = "default") -> dict[str, Any]:
    return pod_body(name, namespace=namespace, labels={"mode": mode})


@pytest.fixture
def admission(api_client: Any) -> Any:
    return client.AdmissionregistrationV1Api(api_client)


@pytest.fixture
def hook(tmp_path: Path) -> Iterator[HookServer]:
    with hook_server(tmp_path / "hook-ca") as running:
        yield running


def configuration(*hooks: dict[str, Any], name: str = CONFIG) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": list(hooks),
    }


@pytest.fixture
def registered(admission: Any, hook: HookServer) -> HookServer:
    """The hook for modes patch/deny/deny-code/bad-patch (Fail), an unreachable one for mode unreachable
    (Fail) and one for mode patch (Ignore)."""
    absent = f"https://127.0.0.1:{closed_port()}/hook"
    admission.create_mutating_webhook_configuration(
        configuration(
            webhook("mutate.diff.hami.io", f"{hook.url}/hook", hook.ca_bundle, "Fail", [*MODES]),
            webhook("absent-ignore.diff.hami.io", absent, hook.ca_bundle, "Ignore", ["patch"]),
            webhook("absent-fail.diff.hami.io", absent, hook.ca_bundle, "Fail", ["unreachable"]),
        )
    )
    return hook


# --- the configurations as an API ----------------------------------------------------------------------------


def test_configurations_are_created_with_kube_apiservers_defaults_and_listed(admission: Any, hook: HookServer) -> None:
    hook_spec = webhook("a.diff.hami.io", f"{hook.url}/hook", hook.ca_bundle, "Fail", ["patch"])
    del hook_spec["failurePolicy"], hook_spec["timeoutSeconds"]
    created = admission.create_mutating_webhook_configuration(configuration(hook_spec))
    (stored,) = created.webhooks
    assert stored.failure_policy == "Fail"
    assert stored.match_policy == "Equivalent"
    assert stored.timeout_seconds == 10
    assert stored.reinvocation_policy == "Never"
    assert stored.namespace_selector.to_dict() == {"match_expressions": None, "match_labels": None}
    assert stored.rules[0].scope == "*"
    assert [c.metadata.name for c in admission.list_mutating_webhook_configuration().items] == [CONFIG]
    assert admission.read_mutating_webhook_configuration(CONFIG).metadata.uid == created.metadata.uid


def test_configurations_are_patched_replaced_and_deleted(admission: Any, hook: HookServer) -> None:
    hook_spec = webhook("a.diff.hami.io", f"{hook.url}/hook", hook.ca_bundle, "Fail", ["patch"])
    admission.create_mutating_webhook_configuration(configuration(hook_spec))
    patch = [{"op": "replace", "path": "/webhooks/0/timeoutSeconds", "value": 3}]
    patched = admission.patch_mutating_webhook_configuration(CONFIG, patch)
    assert patched.webhooks[0].timeout_seconds == 3
    patched.webhooks[0].failure_policy = "Ignore"
    assert admission.replace_mutating_webhook_configuration(CONFIG, patched).webhooks[0].failure_policy == "Ignore"
    admission.delete_mutating_webhook_configuration(CONFIG)
    with pytest.raises(ApiException) as err:
        admission.read_mutating_webhook_configuration(CONFIG)
    assert err.value.status == 404


def test_an_invalid_configuration_is_422(emulator: KubeApiEmulator, hook: HookServer) -> None:
    hook_spec = webhook("short.name", f"{hook.url}/hook", hook.ca_bundle, "Fail", ["patch"])
    del hook_spec["sideEffects"]  # the official client refuses to send this: a raw request
    answer = httpx.post(f"{emulator.url}{CONFIGS_PATH}", json=configuration(hook_spec))
    assert answer.status_code == 422
    fields = [c["field"] for c in answer.json()["details"]["causes"]]
    assert fields == ["webhooks[0].name", "webhooks[0].sideEffects"]


# --- calls on pod create -------------------------------------------------------------------------------------


def test_a_dry_run_create_is_admitted_with_dry_run_set_and_stores_nothing(
    emulator: KubeApiEmulator, core: Any, registered: HookServer
) -> None:
    """How a stack asks whether admission is wired (kube-apiserver's ``dryRun=All``): the webhook is called,
    told it is a dry run (so it has no side effects), and its mutation comes back; nothing is stored."""
    pod = moded("dry", "patch")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}  # a number, as YAML has it
    answer = httpx.post(f"{emulator.url}/api/v1/namespaces/default/pods?dryRun=All", json=pod)
    assert answer.status_code == 201, answer.text
    made = answer.json()
    assert made["spec"]["schedulerName"] == "hami-scheduler"
    assert made["metadata"]["annotations"] == {MUTATED: "yes"}
    ((_, review),) = registered.seen
    assert review["request"]["dryRun"] is True
    # the webhook sees the object as decoded: quantities are strings
    assert review["request"]["object"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == []


def test_a_dry_run_is_refused_where_it_is_not_a_create(emulator: KubeApiEmulator) -> None:
    answer = httpx.get(f"{emulator.url}/api/v1/namespaces/default/pods?dryRun=All")
    assert answer.status_code == 400


def test_a_matching_webhook_gets_an_admission_review_and_its_patch_is_applied(
    core: Any, registered: HookServer
) -> None:
    pod = moded("p", "patch")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    created = core.create_namespaced_pod("default", pod)
    assert created.metadata.annotations == {MUTATED: "yes"}
    assert created.spec.scheduler_name == "hami-scheduler"
    ((path, review),) = registered.seen
    assert path == "/hook?timeout=5s"
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    request = review["request"]
    assert request["operation"] == "CREATE"
    assert (request["namespace"], request["name"]) == ("default", "p")
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert request["userInfo"] == {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}
    sent = request["object"]
    assert "uid" not in sent["metadata"]  # admitted before it is stored
    assert sent["spec"]["schedulerName"] == "default-scheduler"  # defaulted before admission
    assert sent["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": "1"},
        "requests": {"nvidia.com/gpu": "1"},
    }


def test_a_refusal_is_400_with_kube_apiservers_message(core: Any, registered: HookServer) -> None:
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", moded("p", "deny"))
    status = status_of(err.value)
    assert (err.value.status, status["code"], status.get("reason", "")) == (400, 400, "")
    assert status["message"] == 'admission webhook "mutate.diff.hami.io" denied the request: no GPUs for you'
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", moded("q", "deny-code"))
    status = status_of(err.value)
    assert (err.value.status, status["reason"]) == (403, "Forbidden")
    assert status["message"] == 'admission webhook "mutate.diff.hami.io" denied the request: over quota'
    assert core.list_namespaced_pod("default").items == []


def test_an_unreachable_webhook_refuses_with_500_when_it_fails_closed(core: Any, registered: HookServer) -> None:
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", moded("p", "unreachable"))
    status = status_of(err.value)
    assert (err.value.status, status["reason"]) == (500, "InternalError")
    assert re.fullmatch(
        r'Internal error occurred: failed calling webhook "absent-fail\.diff\.hami\.io": failed to call webhook: '
        r'Post "https://127\.0\.0\.1:\d+/hook\?timeout=5s": dial tcp 127\.0\.0\.1:\d+: connect: connection refused',
        status["message"],
    )


def test_an_unreachable_webhook_that_fails_open_is_skipped(core: Any, registered: HookServer) -> None:
    created = core.create_namespaced_pod("default", moded("p", "patch"))  # absent-ignore is called too
    assert created.metadata.annotations == {MUTATED: "yes"}


def test_an_invalid_answer_fails_the_call(core: Any, registered: HookServer) -> None:
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", moded("p", "bad-patch"))
    assert err.value.status == 500
    assert "webhook returned response.patch but not response.patchType" in status_of(err.value)["message"]


def test_pods_the_selectors_leave_out_are_not_sent(core: Any, admission: Any, hook: HookServer) -> None:
    core.create_namespace({"metadata": {"name": "team-a"}})
    core.create_namespace({"metadata": {"name": "team-b"}})
    assert core.read_namespace("team-a").metadata.labels == {"kubernetes.io/metadata.name": "team-a"}
    hook_spec = webhook("a.diff.hami.io", f"{hook.url}/hook", hook.ca_bundle, "Fail", ["deny"], namespace="team-a")
    admission.create_mutating_webhook_configuration(configuration(hook_spec))
    core.create_namespaced_pod("team-b", moded("other-namespace", "deny", "team-b"))
    core.create_namespaced_pod("team-a", moded("other-mode", "patch", "team-a"))
    with pytest.raises(ApiException):
        core.create_namespaced_pod("team-a", moded("selected", "deny", "team-a"))
    assert [review["request"]["name"] for _, review in hook.seen] == ["selected"]


def test_match_conditions_are_evaluated(core: Any, admission: Any, hook: HookServer) -> None:
    hook_spec = webhook("a.diff.hami.io", f"{hook.url}/hook", hook.ca_bundle, "Fail", ["deny"])
    hook_spec["matchConditions"] = [{"name": "gpu", "expression": "object.metadata.name.startsWith('gpu-')"}]
    admission.create_mutating_webhook_configuration(configuration(hook_spec))
    core.create_namespaced_pod("default", moded("cpu-pod", "deny"))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", moded("gpu-pod", "deny"))
    assert err.value.status == 400


def test_a_match_condition_that_fails_to_evaluate_is_403_when_failing_closed(
    core: Any, admission: Any, hook: HookServer
) -> None:
    hook_spec = webhook("a.diff.hami.io", f"{hook.url}/hook", hook.ca_bundle, "Fail", ["patch"])
    hook_spec["matchConditions"] = [{"name": "broken", "expression": "object.spec.nodeName == 'x'"}]
    admission.create_mutating_webhook_configuration(configuration(hook_spec))
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod("default", moded("p", "patch"))
    status = status_of(err.value)
    assert (err.value.status, status["reason"]) == (403, "Forbidden")
    assert status["message"].startswith('pods "p" is forbidden: broken: ')


def test_generated_names_are_sent_without_a_name_and_impersonation_names_the_user(
    api_client: Any, registered: HookServer
) -> None:
    body = moded("", "patch")
    body["metadata"] = {"generateName": "gen-", "labels": {"mode": "patch"}}
    core: Any = client.CoreV1Api(api_client)
    created = core.create_namespaced_pod(
        "default", body, _headers={"Impersonate-User": "alice", "Impersonate-Group": "team-a"}
    )
    assert created.metadata.name.startswith("gen-")
    ((_, review),) = registered.seen
    assert "name" not in review["request"]
    assert review["request"]["userInfo"] == {"username": "alice", "groups": ["team-a", "system:authenticated"]}


def test_webhooks_are_not_called_for_other_kinds_or_without_configurations(core: Any, hook: HookServer) -> None:
    core.create_namespaced_pod("default", moded("p", "deny"))  # nothing registered yet
    core.create_node({"metadata": {"name": "n", "labels": {"mode": "deny"}}})
    assert hook.seen == []


# --- HAMi's own webhook, registered as deploy/ registers it --------------------------------------------------


@pytest.fixture
def hami_webhook(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The real webhook app over TLS (no apiserver, no NATS behind it): its URL and caBundle."""
    ca = CertificateAuthority(tmp_path / "webhook-ca")
    tls = ca.serving("webhook", ("127.0.0.1",))
    with served(offline_settings(TlsFiles(tls.cert, tls.key)), ca.cert_file) as running:
        yield running.url, base64.b64encode(ca.pem).decode()


def test_hamis_webhook_registered_as_deployed_mutates_gpu_pods_only(
    core: Any, admission: Any, hami_webhook: tuple[str, str]
) -> None:
    url, ca_bundle = hami_webhook
    deployed = yaml.safe_load(DEPLOYED.read_text())
    for hook_spec in deployed["webhooks"]:
        path = hook_spec["clientConfig"]["service"].get("path", "/webhook")
        hook_spec["clientConfig"] = {"url": url + path, "caBundle": ca_bundle}
    admission.create_mutating_webhook_configuration(deployed)
    gpu = pod_body("gpu")
    gpu["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert core.create_namespaced_pod("default", gpu).spec.scheduler_name == "hami-scheduler"
    assert core.create_namespaced_pod("default", pod_body("cpu")).spec.scheduler_name == "default-scheduler"
    core.create_namespace({"metadata": {"name": "hami-system"}})
    gpu["metadata"]["namespace"] = "hami-system"
    assert core.create_namespaced_pod("hami-system", gpu).spec.scheduler_name == "default-scheduler"
