"""The RBAC of deploy/kustomize/base, applied with the real kubectl to the real kube-apiserver: each service's
ServiceAccount may do what the service does and nothing more. That it grants *enough* is shown by the
stack tests, where every service runs on its own account's token."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hami_sim.realk8s import SYSTEM_NAMESPACE, ApiError, ControlPlane, apply, deployed, rbac_documents

# (account, kubectl auth can-i arguments, allowed)
RULES = [
    ("hami-scheduler", ["create", "pods", "--subresource=binding", "-n", "tenant"], True),
    ("hami-scheduler", ["patch", "pods", "-n", "tenant"], True),
    ("hami-scheduler", ["patch", "nodes"], True),
    ("hami-scheduler", ["create", "events", "-n", "tenant"], True),
    ("hami-scheduler", ["update", "leases/hami-scheduler", "-n", SYSTEM_NAMESPACE], True),
    ("hami-scheduler", ["update", "leases/kube-controller-manager", "-n", SYSTEM_NAMESPACE], False),
    ("hami-scheduler", ["delete", "pods", "-n", "tenant"], True),  # system:kube-scheduler: preemption evicts
    ("hami-scheduler", ["delete", "namespaces"], False),
    ("hami-scheduler", ["create", "clusterrolebindings"], False),
    ("hami-scheduler", ["create", "pods", "-n", "tenant"], False),
    ("hami-scheduler", ["get", "secrets", "-n", "tenant"], False),
    ("hami-scheduler", ["delete", "nodes"], False),
    ("hami-webhook", ["list", "resourcequotas", "-n", "tenant"], True),
    ("hami-webhook", ["watch", "namespaces"], True),
    ("hami-webhook", ["patch", "pods", "-n", "tenant"], False),
    ("hami-webhook", ["create", "pods", "--subresource=binding", "-n", "tenant"], False),
    ("hami-webhook", ["get", "secrets", "-n", SYSTEM_NAMESPACE], False),
    ("hami-node", ["patch", "pods", "-n", "tenant"], True),
    ("hami-node", ["patch", "nodes"], True),
    ("hami-node", ["create", "pods", "--subresource=binding", "-n", "tenant"], False),
    ("hami-node", ["delete", "pods", "-n", "tenant"], False),
    ("hami-node", ["update", "leases/hami-scheduler", "-n", SYSTEM_NAMESPACE], False),
    ("hami-metrics", ["list", "pods"], False),
    ("hami-nats", ["get", "secrets", "-n", SYSTEM_NAMESPACE], False),
]


@pytest.fixture(scope="module")
def accounts(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """account -> a kubeconfig holding a TokenRequest token of that ServiceAccount."""
    folder = tmp_path_factory.mktemp("rbac")
    admin = plane.write_kubeconfig(folder / "admin")
    out = apply(plane.binaries, admin, rbac_documents(deployed(plane.binaries)))
    assert "clusterrole.rbac.authorization.k8s.io/hami-extender" in out
    return {
        account: plane.write_token_kubeconfig(folder / account, plane.token(SYSTEM_NAMESPACE, account, 3600))
        for account in {rule[0] for rule in RULES}
    }


@pytest.mark.parametrize(("account", "question", "allowed"), RULES, ids=[f"{r[0]} {' '.join(r[1])}" for r in RULES])
def test_each_account_may_do_what_its_service_does_and_no_more(
    plane: ControlPlane, accounts: dict[str, Path], account: str, question: list[str], allowed: bool
) -> None:
    done = subprocess.run(
        [plane.binaries["kubectl"], "--kubeconfig", str(accounts[account]), "auth", "can-i", *question],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.stdout.strip() == ("yes" if allowed else "no"), done.stderr


def test_a_forbidden_call_is_refused_by_the_apiserver(plane: ControlPlane, accounts: dict[str, Path]) -> None:
    """Not only the review: the webhook's own token cannot patch a pod (the extender's job)."""
    plane.ensure_namespace("rbac-check")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    plane.create("", "v1", "pods", "rbac-check", pod)
    token = str(_token_of(accounts["hami-webhook"]))
    with pytest.raises(ApiError) as refused:
        plane.request_as(
            token,
            "PATCH",
            "/api/v1/namespaces/rbac-check/pods/p",
            {"metadata": {"annotations": {"hami.io/vgpu-node": "n1"}}},
            "application/merge-patch+json",
        )
    assert refused.value.status == 403
    assert "system:serviceaccount:hami-system:hami-webhook" in refused.value.body


def _token_of(kubeconfig: Path) -> str:
    import yaml

    token: str = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    return token
