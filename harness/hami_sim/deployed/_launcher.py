"""The rendered deploy/ overlay as the running system: its objects in the apiserver, its pods as processes.

``Launcher(plane, workdir, nodes=...)`` renders an overlay (dev by default, its secrets generated into a
scratch copy of deploy/ as an operator would), applies every object that is not a workload to the real
kube-apiserver as rendered (RBAC, ServiceAccounts, the MutatingWebhookConfiguration, the admission
policies, ConfigMaps, Secrets, Services, PDBs, NetworkPolicies, quotas), and runs each Deployment's and
StatefulSet's replicas and each DaemonSet's pod per matching node as local processes, exactly as the
pod spec says (:mod:`._pods`), with the few stand-ins of :mod:`._mapping`. Containers are restarted when
they exit, as a kubelet restarts them; a pod can be killed (SIGKILL, a lost node) and started again.
"""

from __future__ import annotations

import base64
import copy
import http.client
import logging
import os
import random
import shlex
import socket
import ssl
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from hami_common.inventory import FAKE
from hami_common.settings import env_name
from hami_sim.deployed._mapping import image_folder, pod_network_flags, program
from hami_sim.deployed._pods import ContainerPlan, PodPlan, PodPlanner, PodSlot, service_routes
from hami_sim.deployed._render import Rendering, prepare_tree, render
from hami_sim.realk8s import ControlPlane, Peer, apply, uts_namespaces_work

__all__ = ["RESERVED_ADDRESSES", "LaunchedPod", "Launcher"]

log = logging.getLogger(__name__)

Json = dict[str, Any]
RESERVED_ADDRESSES: Final = 16  # the first addresses of the block, named in every serving certificate
_READY_TIMEOUT_S: Final = 120.0
_INIT_TIMEOUT_S: Final = 60.0
INVENTORY_ENV: Final = env_name("inventory")
NVML_INVENTORY: Final = "nvml"
FAKE_INVENTORY_ENV: Final = env_name("fake_inventory")
VENDOR_ROOT_ENV: Final = env_name("vendor_host_root")
_KEPT_ENV: Final = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")


@dataclass(eq=False)
class LaunchedPod:
    plan: PodPlan
    containers: dict[str, Peer] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.plan.name

    def container(self, name: str) -> Peer:
        return self.containers[name]

    def kill(self) -> None:
        """SIGKILL every container, as a node dying under the pod would."""
        for peer in self.containers.values():
            peer.kill()

    def stop(self) -> None:
        for peer in reversed(list(self.containers.values())):
            peer.stop()

    def start(self) -> None:
        for peer in self.containers.values():
            peer.start()

    @property
    def pids(self) -> dict[str, int]:
        return {name: peer.pid for name, peer in self.containers.items() if peer.pid is not None}


def _address_block() -> str:
    """A /24 of the loopback range for this run's pods, not 127.0.0.0/24 (the machine's own services)."""
    rng = random.SystemRandom()
    while True:
        prefix = f"127.{rng.randint(1, 254)}.{rng.randint(0, 254)}"
        with socket.socket() as probe:
            try:
                probe.bind((f"{prefix}.1", 0))
            except OSError:
                continue
        return prefix


class Launcher:
    def __init__(
        self,
        plane: ControlPlane,
        workdir: Path,
        *,
        nodes: Mapping[str, Mapping[str, str]] = {},
        replicas: Mapping[str, int] = {},
        overlay: str = "dev",
        overlay_files: Mapping[str, str] = {},
        namespace: str = "hami-system",
        hosts: Path | None = None,
        inventory: Path | None = None,
    ) -> None:
        self.plane = plane
        self.workdir = workdir
        self.nodes = dict(nodes)  # node name -> its labels (a DaemonSet's nodeSelector picks among them)
        self.replicas = dict(replicas)  # workload name -> replicas, where a test wants other than rendered
        self.overlay = overlay
        self.overlay_files = dict(overlay_files)  # an overlay of the caller's, written beside deploy/'s own
        self.namespace = namespace
        self.hosts = hosts  # the nodes' root folders (hostPath volumes); short: unix sockets live there
        self.inventory = inventory  # the fake inventory that stands in for NVML (no GPU here)
        self.prefix = _address_block()
        self.separate_hosts = uts_namespaces_work()
        self.rendering: Rendering | None = None
        self.pods: dict[str, LaunchedPod] = {}
        self._slots: list[PodSlot] = []
        self._planner: PodPlanner | None = None

    # --- rendering and planning -----------------------------------------------------------------------

    def render(self) -> Rendering:
        sans = [f"IP:{self.prefix}.{i}" for i in range(1, RESERVED_ADDRESSES + 1)]
        secrets_of = "dev" if self.overlay_files else self.overlay  # the caller's overlay builds on dev
        tree = prepare_tree(self.workdir / "tree", sans=sans, overlay=secrets_of)
        if self.overlay_files:
            folder = tree / "kustomize" / "overlays" / self.overlay
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in self.overlay_files.items():
                (folder / name).write_text(text)
        self.rendering = render(tree / "kustomize" / "overlays" / self.overlay, self.plane.binaries["kubectl"])
        self._slots = self._pod_slots(self.rendering)
        routes = service_routes(self.rendering, self._slots, self.namespace)
        self._planner = PodPlanner(
            self.rendering,
            self.workdir,
            routes=routes,
            image=image_folder(self.workdir),
            namespace=self.namespace,
            api_ca=self.plane.ca.cert_file.read_bytes(),
            hosts=self.hosts,
        )
        return self.rendering

    def _pod_slots(self, rendering: Rendering) -> list[PodSlot]:
        control: list[PodSlot] = []
        daemons: list[PodSlot] = []
        for workload in rendering.workloads():
            kind, name = workload["kind"], workload["metadata"]["name"]
            if kind in ("Deployment", "StatefulSet"):
                count = self.replicas.get(name, int(workload["spec"].get("replicas", 1)))
                scaled = copy.deepcopy(workload)
                scaled["spec"]["replicas"] = count
                for index in range(count):
                    address = f"{self.prefix}.{len(control) + 1}"
                    control.append(PodSlot(scaled, f"{name}-{index}", address))
            elif kind == "DaemonSet":
                selector: Mapping[str, str] = workload["spec"]["template"]["spec"].get("nodeSelector") or {}
                for node, labels in self.nodes.items():
                    if all(labels.get(k) == v for k, v in selector.items()):
                        daemons.append(PodSlot(workload, f"{name}-{node}", "", node))
        if len(control) > RESERVED_ADDRESSES:
            raise RuntimeError(
                f"{len(control)} control-plane pods: at most {RESERVED_ADDRESSES} are named in certificates"
            )
        # a DaemonSet's pods serve nothing over TLS: addresses past the reserved ones, wrapping within the block
        placed = []
        for index, slot in enumerate(daemons):
            number = RESERVED_ADDRESSES + 1 + index % (254 - RESERVED_ADDRESSES)
            placed.append(PodSlot(slot.workload, slot.name, f"{self.prefix}.{number}", slot.node))
        return control + placed

    def plan(self, pod: str) -> PodPlan:
        if self._planner is None:
            raise RuntimeError("render first")
        slot = next((s for s in self._slots if s.name == pod), None)
        if slot is None:
            raise LookupError(f"no pod {pod}; pods: {', '.join(s.name for s in self._slots)}")
        return self._planner.plan(slot)

    def rendering_of(self, workload: str) -> Json:
        """The rendered workload named ``workload`` (with the replicas it runs here)."""
        for slot in self._slots:
            if slot.workload["metadata"]["name"] == workload:
                return slot.workload
        raise LookupError(f"no workload {workload} runs here")

    def pod_names(self, workload: str = "") -> list[str]:
        return [s.name for s in self._slots if not workload or s.workload["metadata"]["name"] == workload]

    # --- the cluster's objects ------------------------------------------------------------------------

    def webhook_url(self, service: Json) -> str:
        """Where the apiserver reaches a webhook's Service here: the pod behind it, by address."""
        if self._planner is None:
            raise RuntimeError("render first")
        ref = service
        names = [f"{ref['name']}.{ref.get('namespace', self.namespace)}.svc"]
        route = self._planner.routes.get(names[0])
        if route is None:
            raise LookupError(f"no pod serves the webhook Service {names[0]}")
        port = route.ports.get(int(ref.get("port", 443)), int(ref.get("port", 443)))
        return f"https://{route.address}:{port}{ref.get('path', '')}"

    def cluster_objects(self, *, webhooks: bool) -> list[Json]:
        if self.rendering is None:
            raise RuntimeError("render first")
        objects = []
        for obj in self.rendering.cluster_objects():
            if obj["kind"] == "MutatingWebhookConfiguration" or obj["kind"] == "ValidatingWebhookConfiguration":
                if not webhooks:
                    continue
                obj = copy.deepcopy(obj)
                for hook in obj["webhooks"]:
                    service = hook["clientConfig"].pop("service", None)
                    if service is not None:
                        hook["clientConfig"]["url"] = self.webhook_url(service)
            objects.append(obj)
        return objects

    def apply_objects(self, *, webhooks: bool = False) -> None:
        """Every rendered object but the workloads, as rendered (webhook Services reached by address); the
        webhook configurations only with ``webhooks`` (once the webhook answers: failurePolicy is Fail)."""
        objects = self.cluster_objects(webhooks=webhooks)
        if webhooks:
            objects = [o for o in objects if o["kind"].endswith("WebhookConfiguration")]
        kubeconfig = self.workdir / "admin.kubeconfig"
        if not kubeconfig.exists():
            self.plane.write_kubeconfig(kubeconfig)
        apply(self.plane.binaries, kubeconfig, objects)

    # --- pods -----------------------------------------------------------------------------------------

    def start_pods(self, names: Iterable[str]) -> list[LaunchedPod]:
        return [self.start_pod(name) for name in names]

    def start_pod(self, name: str, *, start: bool = True) -> LaunchedPod:
        """The pod's files, tokens and init containers, then (``start``) its containers."""
        if name in self.pods:
            pod = self.pods[name]
            if start:
                pod.start()
            return pod
        plan = self.plan(name)
        self._write(plan)
        kubeconfig = self._credentials(plan)
        pod = LaunchedPod(plan)
        for container in plan.containers:
            env = self._environment(plan, container, kubeconfig)
            argv = self._argv(plan, container, kubeconfig)
            logfile = plan.folder / "logs" / f"{container.name}.log"
            if container.init:
                self._run_init(plan, container, argv, env, logfile)
                continue
            peer = Peer(f"{plan.name}/{container.name}", argv, logfile, restart=True, env=env)
            pod.containers[container.name] = peer
        self.pods[name] = pod
        if start:
            pod.start()
        return pod

    def _write(self, plan: PodPlan) -> None:
        for folder in plan.folders:
            folder.mkdir(parents=True, exist_ok=True)
        for path, (data, mode) in plan.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            tmp.chmod(mode & 0o777 or 0o600)
            tmp.replace(path)

    def _credentials(self, plan: PodPlan) -> Path | None:
        """The pod's projected tokens from the TokenRequest API (bound to its node, for a DaemonSet's pod), and
        a kubeconfig with its API token for the containers that reach the apiserver."""
        api_token = ""
        for token in plan.tokens:
            value = self.plane.token(
                plan.namespace,
                token.account,
                token.seconds,
                node=plan.node,
                audiences=[token.audience] if token.audience else (),
            )
            token.path.parent.mkdir(parents=True, exist_ok=True)
            token.path.write_text(value)
            token.path.chmod(0o600)
            if token.api_credentials:
                api_token = value
        if not plan.api_access:
            return None
        if not api_token:  # automountServiceAccountToken: the kubelet mounts one at API_TOKEN_DIR
            api_token = self.plane.token(plan.namespace, plan.service_account, 3600, node=plan.node)
        return self.plane.write_token_kubeconfig(plan.folder / "api.kubeconfig", api_token)

    def _environment(self, plan: PodPlan, container: ContainerPlan, kubeconfig: Path | None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in _KEPT_ENV}
        env.update(container.env)
        if self.inventory is not None and env.get(INVENTORY_ENV) == NVML_INVENTORY:
            env[INVENTORY_ENV] = FAKE  # no GPU here: the fake inventory (_mapping.MAPPING)
            env[FAKE_INVENTORY_ENV] = str(self.inventory)
            if self._planner is not None:  # where the fake devices' host files go (Hygon's vdev conf)
                env[VENDOR_ROOT_ENV] = str(self._planner.node_root(plan.node))
        if kubeconfig is not None and container.name in plan.api_access:
            env["KUBECONFIG"] = str(kubeconfig)  # the in-cluster credentials (_mapping.MAPPING)
        return env

    def _argv(self, plan: PodPlan, container: ContainerPlan, kubeconfig: Path | None) -> list[str]:
        argv = [program(container.argv[0], self.plane.binaries), *container.argv[1:]]
        argv += pod_network_flags(container.program, plan.address)
        if container.program == "kube-scheduler" and kubeconfig is not None:
            self._scheduler_credentials(argv, kubeconfig)
        if self.separate_hosts and not container.init:
            command = f"hostname {shlex.quote(plan.name)} && exec {shlex.join(argv)}"
            argv = ["unshare", "--uts", "--", "sh", "-c", command]
        return argv

    @staticmethod
    def _scheduler_credentials(argv: Sequence[str], kubeconfig: Path) -> None:
        """kube-scheduler reads its in-cluster credentials from fixed paths: its config names the kubeconfig."""
        for arg in argv:
            if arg.startswith("--config="):
                path = Path(arg.removeprefix("--config="))
                config = yaml.safe_load(path.read_text())
                config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
                path.write_text(yaml.safe_dump(config, sort_keys=False))

    def _run_init(
        self, plan: PodPlan, container: ContainerPlan, argv: list[str], env: Mapping[str, str], logfile: Path
    ) -> None:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        with logfile.open("ab") as out:
            done = subprocess.run(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=_INIT_TIMEOUT_S
            )
        if done.returncode != 0:
            raise RuntimeError(
                f"init container {plan.name}/{container.name} exited {done.returncode}: {_tail(logfile)}"
            )

    # --- readiness and the end ------------------------------------------------------------------------

    def ready(self, name: str) -> bool:
        """Every container of the pod running, and answering its readinessProbe where it has one."""
        pod = self.pods.get(name)
        if pod is None or not all(peer.running for peer in pod.containers.values()):
            return False
        slot = next(s for s in self._slots if s.name == name)
        for container in slot.spec["containers"]:
            probe = (container.get("readinessProbe") or {}).get("httpGet")
            if probe and not _http_probe(slot.address, container, probe):
                return False
        return True

    def wait_ready(self, names: Iterable[str], timeout: float = _READY_TIMEOUT_S) -> None:
        pending = list(names)
        deadline = time.monotonic() + timeout
        while pending:
            pending = [n for n in pending if not self.ready(n)]
            if not pending:
                return
            if time.monotonic() > deadline:
                tails = "; ".join(
                    f"{peer.name}: {peer.tail(3)}" for n in pending for peer in self.pods[n].containers.values()
                )
                raise RuntimeError(f"pods not ready after {timeout:.0f} s: {', '.join(pending)} ({tails})")
            time.sleep(0.2)

    def stop(self) -> None:
        for pod in reversed(list(self.pods.values())):
            pod.stop()

    def secret_file(self, secret: str, key: str) -> bytes:
        if self.rendering is None:
            raise RuntimeError("render first")
        return base64.b64decode(self.rendering.get("Secret", secret)["data"][key])


def _http_probe(address: str, container: Json, probe: Json) -> bool:
    port = probe["port"]
    if not isinstance(port, int):
        port = next((int(p["containerPort"]) for p in container.get("ports") or [] if p.get("name") == port), 0)
    path = str(probe.get("path", "/"))
    try:
        if str(probe.get("scheme", "HTTP")).upper() == "HTTPS":
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # the kubelet does not verify a probe's certificate either
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(address, port, timeout=2, context=context)
        else:
            conn = http.client.HTTPConnection(address, port, timeout=2)
        try:
            conn.request("GET", path)
            status = conn.getresponse().status
        finally:
            conn.close()
    except OSError:
        return False
    return 200 <= status < 400


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
