"""The objects of ``deploy/kustomize/base`` as the real control plane gets them, rendered by the real kubectl.

RBAC is applied exactly as deployed; the MutatingWebhookConfiguration is deployed with its client config
switched from the in-cluster Service to a loopback URL with the local CA as caBundle (the only change);
the kube-scheduler configuration is the deployed one with the addresses and files of this machine.
"""

from __future__ import annotations

import base64
import copy
import functools
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import yaml

from hami_sim.realk8s._binaries import K8sBinaries, repo_root
from hami_sim.tls import TlsFiles

__all__ = [
    "RBAC_KINDS",
    "apply",
    "deployed",
    "policy_documents",
    "rbac_documents",
    "scheduler_configuration",
    "webhook_configuration",
]

RBAC_KINDS: Final = frozenset(
    {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)
POLICY_KINDS: Final = frozenset({"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"})
SCHEDULER_CONFIGMAP: Final = "hami-kube-scheduler"
Json = dict[str, Any]


@functools.cache
def _rendered(kubectl: str, base: str) -> tuple[Json, ...]:
    out = subprocess.run([kubectl, "kustomize", base], check=True, capture_output=True, text=True).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def deployed(binaries: K8sBinaries, base: Path | None = None) -> list[Json]:
    """Every object of the kustomize base (a fresh copy each call)."""
    where = base or repo_root() / "deploy" / "kustomize" / "base"
    return copy.deepcopy(list(_rendered(binaries["kubectl"], str(where))))


def rbac_documents(documents: Iterable[Json]) -> list[Json]:
    return [doc for doc in documents if doc.get("kind") in RBAC_KINDS]


def policy_documents(documents: Iterable[Json]) -> list[Json]:
    """The ValidatingAdmissionPolicies and their bindings (deploy/kustomize/base/policies)."""
    return [doc for doc in documents if doc.get("kind") in POLICY_KINDS]


def _one(documents: Iterable[Json], kind: str, name: str) -> Json:
    for doc in documents:
        if doc.get("kind") == kind and doc.get("metadata", {}).get("name", "").startswith(name):
            return doc
    raise LookupError(f"deploy/kustomize/base has no {kind} {name}")


def webhook_configuration(documents: Iterable[Json], url: str, ca_pem: bytes) -> Json:
    config = _one(documents, "MutatingWebhookConfiguration", "hami-webhook")
    for hook in config["webhooks"]:
        path = hook["clientConfig"].get("service", {}).get("path", "/webhook")
        hook["clientConfig"] = {"url": url.rstrip("/") + path, "caBundle": base64.b64encode(ca_pem).decode()}
    return config


def scheduler_configuration(
    documents: Iterable[Json],
    *,
    extender_url: str,
    ca_file: Path,
    kubeconfig: Path,
    client: TlsFiles | None = None,
    lease: tuple[float, float, float] = (4.0, 3.0, 1.0),
) -> Json:
    """The deployed KubeSchedulerConfiguration, pointed at ``extender_url`` (trusting ``ca_file``), and
    presenting ``client``'s certificate where the deployed one presents its own (mutual TLS).

    ``lease`` is (leaseDuration, renewDeadline, retryPeriod) in seconds: shorter than the defaults (15, 10,
    2), so a replica taking over after a SIGKILL fits in a test.
    """
    configmap = _one(documents, "ConfigMap", SCHEDULER_CONFIGMAP)
    config: Json = yaml.safe_load(configmap["data"]["config.yaml"])
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    duration, renew, retry = lease
    config["leaderElection"].update(leaseDuration=f"{duration}s", renewDeadline=f"{renew}s", retryPeriod=f"{retry}s")
    for extender in config["extenders"]:
        extender["urlPrefix"] = extender_url
        tls_config: Json = {"caFile": str(ca_file)}
        if client is not None:
            tls_config.update(certFile=str(client.cert), keyFile=str(client.key))
        extender["tlsConfig"] = tls_config
    return config


def apply(binaries: K8sBinaries, kubeconfig: Path, documents: Iterable[Json]) -> str:
    """``kubectl apply -f -`` of ``documents`` with the real kubectl; returns what kubectl printed."""
    text = yaml.safe_dump_all(list(documents), sort_keys=False)
    done = subprocess.run(
        [binaries["kubectl"], "--kubeconfig", str(kubeconfig), "apply", "-f", "-"],
        input=text,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl apply failed: {done.stderr.strip()}")
    return done.stdout
