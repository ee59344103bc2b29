"""The emulated stack's service settings, read from deploy/ as rendered: the same container the launcher runs.

The emulated stack runs every service inside one process, over a plain nats-server and the API emulator, so
it cannot run the containers themselves; it still takes their settings from the manifests, where they are
written once. Every ``HAMI_*`` variable of the container is taken as written, except

* what names a place of the cluster: an address, a mounted file, a host path, the node. The caller maps it
  (the field of the same name, given in ``mapped``), as the launcher maps it for a real pod;
* what a one-process stack has no use for: :data:`EMULATED_AWAY`, each with its reason (the table
  docs/kube-emulator.md shows).

A ``valueFrom`` variable that is neither mapped nor away is an error: a setting added to deploy/ is taken
by the emulated stack or refused loudly, never dropped in silence.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Final, TypeVar, cast

from hami_common.settings import ENV_PREFIX, load
from hami_sim.realk8s import deployed

__all__ = ["EMULATED_AWAY", "deployed_env", "deployed_settings"]

S = TypeVar("S")

_PLAIN_NATS: Final = "a plain nats-server on loopback: no TLS, no NATS users, no auth callout"
_ONE_REPLICA: Final = "one extender, in this process: no Lease to hold, no pod of its own to label"
_NO_PROBES: Final = "no kubelet probes the in-process services"

EMULATED_AWAY: Final[Mapping[str, str]] = {
    "HAMI_NATS_CA_FILE": _PLAIN_NATS,
    "HAMI_NATS_USER": _PLAIN_NATS,
    "HAMI_NATS_PASSWORD": _PLAIN_NATS,
    "HAMI_NATS_TOKEN_FILE": _PLAIN_NATS,
    "HAMI_NATS_IDENTITY": _PLAIN_NATS,
    "HAMI_LEADER_ELECT": _ONE_REPLICA,
    "HAMI_LEADER_FOLLOW": _ONE_REPLICA,
    "HAMI_ROLE_LABEL": _ONE_REPLICA,
    "HAMI_LEASE_NAME": _ONE_REPLICA,
    "HAMI_LEASE_NAMESPACE": _ONE_REPLICA,
    "HAMI_HEALTH_HOST": _NO_PROBES,
    "HAMI_HEALTH_PORT": _NO_PROBES,
    "HAMI_TLS_CLIENT_CA_FILE": "the scheduler stand-in calls the extender over loopback, without a client certificate",
    "HAMI_METRICS_TOKEN_FILE": "the emulated /metrics answers on loopback without a bearer token",
}

Json = dict[str, Any]
_WORKLOADS: Final = frozenset({"Deployment", "DaemonSet", "StatefulSet"})


def _field(variable: str) -> str:
    return variable.removeprefix(ENV_PREFIX).lower()


def _find(documents: Iterable[Json], workload: str, container: str) -> Json:
    for doc in documents:
        if doc.get("kind") in _WORKLOADS and doc["metadata"]["name"] == workload:
            spec = doc["spec"]["template"]["spec"]
            for ctr in (*spec.get("initContainers", ()), *spec["containers"]):
                if ctr["name"] == container:
                    return cast(Json, ctr)
            raise LookupError(f"deploy/: {workload} has no container {container}")
    raise LookupError(f"deploy/ has no workload {workload}")


@functools.cache
def _container(workload: str, container: str) -> Json:
    """The container in deploy/kustomize/base, rendered once per process."""
    return _find(deployed(), workload, container)


def _of(workload: str, container: str, documents: Iterable[Json] | None) -> Json:
    return _container(workload, container) if documents is None else _find(documents, workload, container)


def deployed_env(
    workload: str, container: str, documents: Iterable[Json] | None = None
) -> tuple[tuple[str, str | None], ...]:
    """The ``HAMI_*`` variables of one container, in order: (name, value), value ``None`` where the manifest
    takes it ``valueFrom`` a Secret, a ConfigMap or the pod's fields. ``documents``: a rendering other than
    deploy/kustomize/base (an overlay, a component)."""
    env = _of(workload, container, documents).get("env", ())
    return tuple((e["name"], e.get("value")) for e in env if e["name"].startswith(ENV_PREFIX))


def deployed_settings(
    cls: type[S],
    workload: str,
    container: str,
    *,
    mapped: Mapping[str, Any],
    away: Collection[str] = (),
    documents: Iterable[Json] | None = None,
) -> S:
    """``cls`` as the container's flags and environment in deploy/ fill it, with ``mapped`` (fields)
    replacing what names a place of the cluster. ``away``: variables this caller has no use for beyond
    :data:`EMULATED_AWAY` (say why where it is passed). ``documents``: as for :func:`deployed_env`."""
    documents = None if documents is None else list(documents)
    ctr = _of(workload, container, documents)
    taken: dict[str, str] = {}
    for name, value in deployed_env(workload, container, documents):
        if _field(name) in mapped or name in EMULATED_AWAY or name in away:
            continue
        if value is None:
            raise LookupError(
                f"deploy/: {workload}/{container} takes {name} from a Secret, ConfigMap or field; "
                "the emulated stack must map it or list it in EMULATED_AWAY"
            )
        taken[name] = value
    # the service's own flags, after its program (deploy/ sets none today; one added there is taken here)
    flags = [*ctr.get("command", ())[1:], *ctr.get("args", ())]
    return load(cls, flags, env=taken, given=mapped)
