"""The local stack on the real control plane (``StackConfig.kube == "real"``): deploy/ as shipped.

etcd and kube-apiserver run here; everything else is the rendered dev overlay plus the stack's own overlay
(:mod:`._overlay`: policies, device config, MIG node config, NATS servers), launched by
:class:`hami_sim.deployed.Launcher`: every object applied as rendered, NATS with TLS and its auth callout,
the webhook, the metrics service, each ``hami-scheduler`` pod (kube-scheduler and its extender, a host name
each) and each node's ``hami-node`` pod run as processes with exactly their pod spec. The kubelets are the
stack's (emulated, beside the launched node pods); the real kubelet has its own tests.
"""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hami_sim.deployed import LaunchedPod, Launcher
from hami_sim.realk8s import SYSTEM_NAMESPACE, ApiError, ControlPlane, Peer
from hami_sim.stack._config import StackConfig
from hami_sim.stack._overlay import LOCAL_OVERLAY, local_overlay

__all__ = ["ExtenderReplica", "LaunchedNats", "RealKube"]

log = logging.getLogger(__name__)

SCHEDULER: Final = "hami-scheduler"
WEBHOOK: Final = "hami-webhook"
METRICS: Final = "hami-metrics"
NATS: Final = "hami-nats"
NODE: Final = "hami-node"
_READY_TIMEOUT_S: Final = 180.0
_PROBE_POD: Final = "hami-webhook-probe"
Json = dict[str, Any]


def _port(container: Json, name: str) -> int:
    return next(int(p["containerPort"]) for p in container.get("ports") or [] if p.get("name") == name)


def _env_value(container: Json, name: str) -> str:
    return next(str(e.get("value", "")) for e in container.get("env") or [] if e["name"] == name)


@dataclass(eq=False)
class ExtenderReplica:
    """One launched ``hami-scheduler`` pod: its kube-scheduler and its extender."""

    index: int
    pod: LaunchedPod
    url: str

    @property
    def identity(self) -> str:
        return self.pod.name

    @property
    def extender(self) -> Peer:
        return self.pod.container("extender")

    @property
    def scheduler(self) -> Peer:
        return self.pod.container("kube-scheduler")

    def kill(self) -> None:
        """SIGKILL both processes, as a node dying under the pod would."""
        self.pod.kill()


class LaunchedNats:
    """The launched NATS StatefulSet, with the surface of the stack's embedded server (chaos)."""

    def __init__(self, real: RealKube) -> None:
        self._real = real

    @property
    def pods(self) -> list[LaunchedPod]:
        return [self._real.launcher.pods[n] for n in self._real.launcher.pod_names(NATS)]

    @property
    def url(self) -> str:
        return ",".join(f"tls://{p.plan.address}:4222" for p in self.pods)

    @property
    def pid(self) -> int | None:
        return self.pods[0].container("nats").pid if self.pods else None

    def restart(self) -> None:
        for pod in self.pods:
            pod.stop()
            pod.start()
        self._real.launcher.wait_ready([p.name for p in self.pods])

    def kill(self, index: int) -> None:
        self.pods[index].container("nats").kill()

    def revive(self, index: int) -> None:
        self.pods[index].container("nats").start()

    def stop(self) -> None:
        for pod in self.pods:
            pod.stop()


class RealKube:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.plane = ControlPlane(workdir=config.workdir / "k8s")
        self.binaries = self.plane.binaries
        self.replicas: list[ExtenderReplica] = []
        self.nats = LaunchedNats(self)
        self._launcher: Launcher | None = None
        self._client_tls: ssl.SSLContext | None = None

    @property
    def launcher(self) -> Launcher:
        if self._launcher is None:
            raise RuntimeError("the control plane is not started")
        return self._launcher

    @property
    def separate_hosts(self) -> bool:
        return self.launcher.separate_hosts

    # --- start-up, in order -------------------------------------------------------------------------------

    def start_plane(self, nodes: Mapping[str, Mapping[str, str]]) -> None:
        """etcd, kube-apiserver and the admin kubeconfig; the overlay rendered and its objects applied; NATS."""
        self.plane.start()
        self.plane.write_kubeconfig(self.config.kubeconfig)
        replicas = max(self.config.scheduler_replicas, 1)
        self._launcher = Launcher(
            self.plane,
            self.config.workdir / "deployed",
            nodes=nodes,
            replicas={SCHEDULER: replicas},
            overlay=LOCAL_OVERLAY,
            overlay_files=local_overlay(self.config),
            hosts=self.config.sockdir,
            inventory=self.config.inventory_file,
        )
        if replicas > 1 and not self._launcher.separate_hosts:
            raise RuntimeError("two scheduler replicas need a UTS namespace each (unshare --uts), refused here")
        self.launcher.render()
        self.launcher.apply_objects()
        nats = self.launcher.pod_names(NATS)
        self.launcher.start_pods(nats)
        self.launcher.wait_ready(nats, _READY_TIMEOUT_S)

    def start_control(self) -> None:
        """The webhook, the metrics service and every scheduler pod; returns once each answers its probes."""
        launcher = self.launcher
        names = [*launcher.pod_names(WEBHOOK), *launcher.pod_names(METRICS), *launcher.pod_names(SCHEDULER)]
        launcher.start_pods(names)
        launcher.wait_ready(names, _READY_TIMEOUT_S)
        scheduler = launcher.rendering_of(SCHEDULER)
        extender = next(c for c in scheduler["spec"]["template"]["spec"]["containers"] if c["name"] == "extender")
        port = int(_env_value(extender, "HAMI_HTTP_PORT"))
        self.replicas = [
            ExtenderReplica(index, launcher.pods[name], f"https://{launcher.pods[name].plan.address}:{port}")
            for index, name in enumerate(launcher.pod_names(SCHEDULER))
        ]
        self._client_tls = self._scheduler_client_tls()

    def node_plugin_dir(self, node: str) -> Path:
        """Where the node pod's allocator serves its socket (the hostPath of deploy/): the kubelet's folder."""
        return self._node_path(node, "allocator", "HAMI_PLUGIN_DIR")

    def node_pod_resources(self, node: str) -> Path:
        return self._node_path(node, "allocator", "HAMI_POD_RESOURCES_SOCKET")

    def node_staging_dir(self, node: str) -> Path:
        return self._node_path(node, "allocator", "HAMI_STAGING_DIR")

    def _node_path(self, node: str, container: str, variable: str) -> Path:
        plan = self.launcher.plan(f"{NODE}-{node}")
        found = next(c for c in plan.containers if c.name == container)
        return Path(found.env[variable])

    def prepare_nodes(self, nodes: Iterable[str]) -> None:
        """Each node's pod made (files, tokens, init container) but not started: its kubelet comes first."""
        for node in nodes:
            self.launcher.start_pod(f"{NODE}-{node}", start=False)

    @property
    def webhook_ca_file(self) -> Path:
        """The CA of the webhook's serving certificate (Secret hami-webhook-tls): what the apiserver trusts."""
        path = self.config.workdir / "deployed" / "webhook-ca.crt"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.launcher.secret_file("hami-webhook-tls", "ca.crt"))
        return path

    def extenders_ready(self) -> bool:
        """Every extender answers /readyz and its ledger holds every node: the GPU nodes, the MIG nodes and each
        vendor's node (counting ``config.nodes`` alone waited forever for a default ``hami up --kube real``)."""
        wanted = len(self.config.node_names())
        return all(self.extender_state(r).get("nodes") == wanted for r in self.replicas)

    def _scheduler_client_tls(self) -> ssl.SSLContext:
        """kube-scheduler's client certificate (Secret hami-scheduler-client-tls): the extender serves no other."""
        folder = self.config.workdir / "deployed" / "scheduler-client"
        folder.mkdir(parents=True, exist_ok=True)
        for key in ("tls.crt", "tls.key", "ca.crt"):
            path = folder / key
            path.write_bytes(self.launcher.secret_file("hami-scheduler-client-tls", key))
            path.chmod(0o600)
        context = ssl.create_default_context(cafile=str(folder / "ca.crt"))
        context.check_hostname = False  # dialled by its pod's address; the CA still vouches for it
        context.load_cert_chain(str(folder / "tls.crt"), str(folder / "tls.key"))
        return context

    def extender_state(self, replica: ExtenderReplica) -> Json:
        """What the replica's /readyz says (leader, synced, nodes, ...), or {} while it does not answer."""
        if self._client_tls is None:
            return {}
        host, port = replica.url.removeprefix("https://").rsplit(":", 1)
        conn = http.client.HTTPSConnection(host, int(port), context=self._client_tls, timeout=5)
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

    def register_webhook(self) -> None:
        """The rendered webhook configurations, their Services reached by address; returns once the apiserver
        calls the webhook (a dry-run GPU pod comes back routed to hami-scheduler)."""
        self.launcher.apply_objects(webhooks=True)
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
        return bool(made.get("spec", {}).get("schedulerName") == SCHEDULER)

    def wait_leader(self) -> None:
        """kube-scheduler calls its extender as soon as it holds the Lease; the extender leads once it has seen
        that (it polls the Lease), so wait for it rather than let the first pods meet "not the leader"."""
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while not any(self.extender_state(r).get("leader") for r in self.replicas):
            if time.monotonic() > deadline:
                tails = "; ".join(r.scheduler.tail(5) for r in self.replicas)
                raise RuntimeError(f"no kube-scheduler replica took the hami-scheduler Lease: {tails}")
            time.sleep(0.1)

    # --- using it ------------------------------------------------------------------------------------------

    @property
    def webhook_url(self) -> str:
        pod = self.launcher.pods[self.launcher.pod_names(WEBHOOK)[0]]
        container = self.launcher.rendering_of(WEBHOOK)["spec"]["template"]["spec"]["containers"][0]
        return f"https://{pod.plan.address}:{_env_value(container, 'HAMI_PORT')}"

    @property
    def metrics_url(self) -> str:
        pod = self.launcher.pods[self.launcher.pod_names(METRICS)[0]]
        container = self.launcher.rendering_of(METRICS)["spec"]["template"]["spec"]["containers"][0]
        return f"http://{pod.plan.address}:{_env_value(container, 'HAMI_HTTP_PORT')}/metrics"

    @property
    def metrics_token(self) -> str:
        """The bearer token /metrics requires (Secret hami-metrics-token), as Prometheus presents it."""
        return self.launcher.secret_file("hami-metrics-token", "token").decode().strip()

    def node_pod(self, node: str) -> LaunchedPod:
        return self.launcher.pods[f"{NODE}-{node}"]

    def leader(self) -> ExtenderReplica | None:
        """The replica whose kube-scheduler holds the hami-scheduler Lease now."""
        try:
            lease = self.plane.request(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/{SCHEDULER}"
            )
        except ApiError:
            return None
        holder = str(lease.get("spec", {}).get("holderIdentity") or "")
        return next((r for r in self.replicas if holder.startswith(f"{r.identity}_")), None)

    def restart_leader_extender(self) -> None:
        replica = self.leader() or self.replicas[0]
        replica.extender.kill()
        replica.extender.start()

    def processes(self) -> list[tuple[str, int | None]]:
        """Every launched container's process, by pod/container."""
        if self._launcher is None:
            return []
        return [(peer.name, peer.pid) for pod in self._launcher.pods.values() for peer in pod.containers.values()]

    def stop_schedulers(self) -> None:
        for replica in self.replicas:
            replica.scheduler.stop()

    def close(self) -> None:
        if self._launcher is not None:
            self.stop_schedulers()
            self._launcher.stop()
        self.plane.close()
