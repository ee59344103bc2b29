"""The local stack on the real control plane (``StackConfig.kube == "real"``).

What the emulated stack plays, real peers do here: kube-apiserver calls the webhook (the deployed
MutatingWebhookConfiguration, pointed at a loopback URL), kube-scheduler replicas call the extender
(the deployed KubeSchedulerConfiguration), and every service runs as its own ServiceAccount, with the
deployed RBAC, on a token from the TokenRequest API. The extender runs as the deployed pod runs it: one
``hami-extender`` process per kube-scheduler replica, leading while its replica holds the
``hami-scheduler`` Lease; each replica pair has its own host name (a UTS namespace), as each pod would.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import logging
import ssl
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hami_common.settings import to_argv
from hami_extender.settings import ExtenderSettings
from hami_sim.realk8s import (
    SYSTEM_NAMESPACE,
    ApiError,
    ControlPlane,
    KubeScheduler,
    Peer,
    apply,
    deployed,
    free_port,
    policy_documents,
    rbac_documents,
    scheduler_configuration,
    uts_namespaces_work,
    webhook_configuration,
)
from hami_sim.stack._config import NODE_PLACEHOLDER, StackConfig
from hami_sim.tls import CertificateAuthority, TlsFiles

__all__ = ["ACCOUNTS", "ExtenderReplica", "RealKube"]

log = logging.getLogger(__name__)

# The ServiceAccounts of deploy/kustomize/base/rbac, by the service that runs as each.
ACCOUNTS: Final = {"webhook": "hami-webhook", "scheduler": "hami-scheduler", "node": "hami-node"}
_EXTENDER_MAIN: Final = "import sys; from hami_extender.main import main; sys.exit(main(sys.argv[1:]))"
_READY_TIMEOUT_S: Final = 120.0
_PROBE_POD: Final = "hami-webhook-probe"
Json = dict[str, Any]


@dataclass(eq=False)
class ExtenderReplica:
    """One scheduler pod: a kube-scheduler replica and its extender, sharing a host name."""

    index: int
    identity: str
    port: int
    extender: Peer
    scheduler: KubeScheduler | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def kill(self) -> None:
        """SIGKILL both processes, as a node dying under the pod would."""
        if self.scheduler is not None:
            self.scheduler.kill()
        self.extender.kill()


class RealKube:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.plane = ControlPlane(workdir=config.workdir / "k8s")
        self.binaries = self.plane.binaries
        self.credentials: dict[str, Path] = {}  # ServiceAccount -> kubeconfig with its token
        self.replicas: list[ExtenderReplica] = []
        self.separate_hosts = uts_namespaces_work()
        self._documents: list[Json] = []
        self._tls: TlsFiles | None = None
        self._client: TlsFiles | None = None  # kube-scheduler's client certificate for the extender

    # --- start-up, in order -------------------------------------------------------------------------------

    def start_plane(self) -> None:
        """etcd, kube-apiserver, the admin kubeconfig, the deployed RBAC, a token per service account."""
        self.plane.start()
        self.plane.write_kubeconfig(self.config.kubeconfig)
        self._documents = deployed(self.binaries)
        apply(self.binaries, self.config.kubeconfig, rbac_documents(self._documents))
        apply(self.binaries, self.config.kubeconfig, policy_documents(self._documents))
        for account in ACCOUNTS.values():
            token = self.plane.token(SYSTEM_NAMESPACE, account)
            path = self.plane.workdir / f"{account}.kubeconfig"
            self.credentials[account] = self.plane.write_token_kubeconfig(path, token)

    def kubeconfig_of(self, service: str) -> str:
        return str(self.credentials[ACCOUNTS[service]])

    def node_kubeconfigs(self, nodes: Iterable[str]) -> str:
        """One kubeconfig per node, with a token bound to that Node (its ``node-name`` claim is what the
        hami-node-restriction policy checks, as a DaemonSet pod's projected token carries it); returns the
        path with ``{node}`` in place of the name (:data:`NODE_PLACEHOLDER`). The Nodes must exist."""
        account = ACCOUNTS["node"]
        for node in nodes:
            token = self.plane.token(SYSTEM_NAMESPACE, account, node=node)
            self.plane.write_token_kubeconfig(self.plane.workdir / f"{account}-{node}.kubeconfig", token)
        return str(self.plane.workdir / f"{account}-{NODE_PLACEHOLDER}.kubeconfig")

    def start_extenders(self, base: ExtenderSettings, tls: TlsFiles) -> None:
        """One ``hami-extender`` process per replica, over mutual TLS, as the scheduler pod runs it: callers
        present a client certificate signed by ``tls``'s CA (kube-scheduler's, made here)."""
        client = CertificateAuthority(tls.ca.parent).client("kube-scheduler-client", "hami-scheduler")
        replicas = max(self.config.scheduler_replicas, 1)
        elect = self.separate_hosts or replicas > 1
        if replicas > 1 and not self.separate_hosts:
            raise RuntimeError("two scheduler replicas need a UTS namespace each (unshare --uts), refused here")
        for index in range(replicas):
            identity = f"hami-scheduler-{index}"
            port = free_port()
            settings = dataclasses.replace(
                base,
                http_host="127.0.0.1",
                http_port=port,
                tls_cert_file=str(tls.cert),
                tls_key_file=str(tls.key),
                tls_client_ca_file=str(tls.ca),
                kubeconfig=self.kubeconfig_of("scheduler"),
                identity=identity,
                leader_elect=elect,
                leader_follow=elect,
                lease_name="hami-scheduler",
                lease_namespace=SYSTEM_NAMESPACE,
                lease_duration=4,
            )
            argv = [sys.executable, "-c", _EXTENDER_MAIN, *to_argv(settings)]
            peer = Peer(f"hami-extender-{index}", argv, self.plane.workdir / "logs" / f"hami-extender-{index}.log")
            peer.start()
            self.replicas.append(ExtenderReplica(index=index, identity=identity, port=port, extender=peer))
        self._tls, self._client = tls, client

    def extenders_ready(self) -> bool:
        """Every extender answers /readyz and its ledger holds every node: the GPU nodes, the MIG nodes and each
        vendor's node (counting ``config.nodes`` alone waited forever for a default ``hami up --kube real``)."""
        wanted = len(self.config.node_names())
        return all(self.extender_state(r).get("nodes") == wanted for r in self.replicas)

    def extender_state(self, replica: ExtenderReplica) -> Json:
        """What the replica's /readyz says (leader, synced, nodes, ...), or {} while it does not answer."""
        if self._tls is None or self._client is None:
            return {}
        context = ssl.create_default_context(cafile=str(self._tls.ca))
        context.load_cert_chain(str(self._client.cert), str(self._client.key))
        conn = http.client.HTTPSConnection("127.0.0.1", replica.port, context=context, timeout=5)
        try:
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            body = response.read()
            state: Json = json.loads(body) if response.status == 200 else {}
            return state
        except (OSError, ValueError):
            return {}
        finally:
            conn.close()

    def register_webhook(self, url: str, ca_pem: bytes) -> None:
        """The deployed MutatingWebhookConfiguration, client config switched to ``url`` + caBundle; returns
        once the apiserver calls it (a dry-run GPU pod comes back routed to hami-scheduler)."""
        config = webhook_configuration(self._documents, url, ca_pem)
        apply(self.binaries, self.config.kubeconfig, [config])
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._webhook_answers():
                return
            time.sleep(0.2)
        raise RuntimeError("kube-apiserver does not call the webhook: " + self.plane.apiserver.tail(10))

    def _webhook_answers(self) -> bool:
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": _PROBE_POD},
            "spec": {"containers": [{"name": "c", "image": "probe", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }
        try:
            made = self.plane.request("POST", "/api/v1/namespaces/default/pods?dryRun=All", probe)
        except ApiError as err:
            log.info("webhook not ready yet: %s", err)
            return False
        return bool(made.get("spec", {}).get("schedulerName") == "hami-scheduler")

    def start_schedulers(self) -> None:
        if self._tls is None or self._client is None:
            raise RuntimeError("start the extenders first")
        for replica in self.replicas:
            config = scheduler_configuration(
                self._documents,
                extender_url=replica.url,
                ca_file=self._tls.ca,
                client=self._client,
                kubeconfig=Path(self.kubeconfig_of("scheduler")),
            )
            scheduler = KubeScheduler(
                self.binaries,
                self.plane.workdir / "scheduler",
                config,
                name=f"kube-scheduler-{replica.index}",
                hostname=replica.identity if self.separate_hosts else "",
            )
            scheduler.start()
            replica.scheduler = scheduler
        # kube-scheduler calls its extender as soon as it holds the Lease; the extender leads once it has seen
        # that (it polls the Lease), so wait for it rather than let the first pods meet "not the leader"
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not any(self.extender_state(r).get("leader") for r in self.replicas):
            if time.monotonic() > deadline:
                tails = "; ".join(r.scheduler.tail(5) for r in self.replicas if r.scheduler is not None)
                raise RuntimeError(f"no kube-scheduler replica took the hami-scheduler Lease: {tails}")
            time.sleep(0.1)

    # --- using it ------------------------------------------------------------------------------------------

    def leader(self) -> ExtenderReplica | None:
        """The replica whose kube-scheduler holds the hami-scheduler Lease now."""
        try:
            lease = self.plane.request(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/hami-scheduler"
            )
        except ApiError:
            return None
        holder = str(lease.get("spec", {}).get("holderIdentity") or "")
        return next((r for r in self.replicas if holder.startswith(f"{r.identity}_")), None)

    def restart_leader_extender(self) -> None:
        replica = self.leader() or self.replicas[0]
        replica.extender.kill()
        replica.extender.start()

    def stop_schedulers(self) -> None:
        for replica in self.replicas:
            if replica.scheduler is not None:
                replica.scheduler.stop()

    def close(self) -> None:
        self.stop_schedulers()
        for replica in self.replicas:
            replica.extender.stop()
        self.plane.close()
