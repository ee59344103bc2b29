"""The whole local cluster: NATS, the API emulator (or the real control plane), every service, N simulated nodes.

``async with LocalCluster(config) as cluster:`` starts, in order: a real ``nats-server`` and the
Kubernetes API emulator (child processes), the Node objects, the webhook (HTTPS, behind the stack's own
CA), the extender and the metrics service (HTTP on loopback, in this process), every node (kubelet
emulator, node agent, allocator; in this process or in ``config.node_hosts`` child processes), and the
kube-scheduler stand-in pointed at the extender. The emulator gets the deployed
MutatingWebhookConfiguration (rendered from deploy/, pointed at the loopback webhook) and calls it as
kube-apiserver does; the stand-in reads the deployed extender's ``managedResources``. ``submit`` is a plain
create, so a pod takes the path it takes on a cluster (``kubectl apply`` too). Each service can be restarted
on its own (chaos).

With ``config.kube == "real"`` the system is deploy/ as shipped (``_realkube``): etcd and kube-apiserver run
here, and the rendered dev overlay (plus the stack's own overlay of choices, ``_overlay``) is applied and
its pods launched as processes exactly as their specs say: NATS with TLS and the auth callout, the webhook,
the metrics service, the scheduler pods (kube-scheduler + extender) and a node pod per node; the kubelets
are the stack's emulated ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Self

import msgspec

from hami_common.bus import EmbeddedNats, NatsCluster
from hami_common.inventory import default_state_file, discard_state
from hami_common.kube import KubeClient, KubeSettings, WatchCache, pod_source
from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY, GPU_MEMORY_PERCENTAGE, GPU_PRIORITY
from hami_common.scheduling import DEFAULT_SCHEDULER_NAME
from hami_common.tracing import service_scope
from hami_extender.app import create_app as create_extender
from hami_extender.ledger import Ledger
from hami_extender.settings import ExtenderSettings
from hami_metrics.app import create_app as create_metrics
from hami_metrics.settings import MetricsSettings
from hami_sim.admission import Admitter
from hami_sim.deployed import deployed_settings
from hami_sim.kubeapi import KubeApiProcess
from hami_sim.realk8s import ControlPlane, ManagedResource, deployed, managed_resources, webhook_configuration
from hami_sim.scheduler import SchedulerDriver, Verdict
from hami_sim.stack._config import (
    MIG_TAINT,
    StackConfig,
    gpu_uuid,
    vendor_capacity,
    write_grant_key,
    write_inventory,
)
from hami_sim.stack._http import bind_loopback, serve_app
from hami_sim.stack._node import Admitted, LaunchedNode, NodeConnections, SimNode, hand_over
from hami_sim.stack._nodehost import NodeHost
from hami_sim.stack._realkube import LaunchedNats, RealKube
from hami_sim.stack._service import ProcessService, RunningService
from hami_sim.stack.audit import GpuCapacity
from hami_sim.tls import TlsFiles, write_serving_certificate
from hami_sim.waiting import eventually
from hami_webhook.app import create_app as create_webhook
from hami_webhook.server import serve as serve_webhook
from hami_webhook.settings import WebhookSettings

__all__ = ["LocalCluster"]

log = logging.getLogger(__name__)

_READY_TIMEOUT_S: Final = 120.0
_READY_PER_DEPLOYED_NODE_S: Final = 3.0
_THREADS: Final = 64  # blocking kube calls of every in-process service share the loop's default executor
Json = dict[str, Any]


class _Port:
    """A loopback port kept across restarts: the first socket is bound at once, later ones on the same port."""

    def __init__(self, port: int = 0) -> None:
        self._first: socket.socket | None = bind_loopback(port)
        self.port: int = self._first.getsockname()[1]

    def socket(self) -> socket.socket:
        sock, self._first = self._first, None
        return sock if sock is not None else bind_loopback(self.port)

    def close(self) -> None:
        if self._first is not None:
            self._first.close()
            self._first = None


class LocalCluster:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.real: RealKube | None = RealKube(config) if config.kube == "real" else None
        self.nats: EmbeddedNats | NatsCluster | LaunchedNats = (
            self.real.nats
            if self.real is not None
            else NatsCluster(config.nats_servers)
            if config.nats_servers > 1
            else EmbeddedNats(store_dir=None)
        )
        self.api: KubeApiProcess | ControlPlane = (
            self.real.plane if self.real is not None else KubeApiProcess(bookmark_interval=1.0, history=20_000)
        )
        self.nodes: dict[str, SimNode] = {}  # nodes in this process (config.node_hosts == 0)
        self.hosts: list[NodeHost] = []  # child processes running the nodes otherwise
        self.submitted_at: dict[str, float] = {}  # pod uid -> time.monotonic() when admission began
        self.admitted: dict[str, Admitted] = {}  # pod uid -> what the kubelet's Allocate calls answered
        self.on_admitted: list[Callable[[Admitted], None]] = []
        self.tls: TlsFiles | None = None
        self.driver: SchedulerDriver | None = None
        self._extender_state: Mapping[str, Any] = {}
        self._metrics_port = _Port(config.metrics_port)
        self._webhook_port = _Port()
        self._extender_port = _Port()
        self._changed = asyncio.Condition()
        self._stack = contextlib.AsyncExitStack()
        self._services: list[RunningService | ProcessService] = []
        self.scheduler: RunningService | None = None
        self.pod_watch: RunningService | None = None
        self._kube: KubeClient | None = None
        self._admitter: Admitter | None = None
        self._documents: list[Json] = []  # deploy/kustomize/base as rendered (the emulated stack's wiring)

    # --- addresses ------------------------------------------------------------------------------------

    @property
    def webhook_url(self) -> str:
        if self.real is not None:
            return self.real.webhook_url
        return f"https://127.0.0.1:{self._webhook_port.port}"

    @property
    def extender_url(self) -> str:
        if self.real is not None and self.real.replicas:
            return self.real.replicas[0].url
        return f"http://127.0.0.1:{self._extender_port.port}"

    def _kubeconfig_of(self, service: str) -> str:
        return str(self.config.kubeconfig)

    @property
    def metrics_url(self) -> str:
        if self.real is not None:
            return self.real.metrics_url
        return f"http://127.0.0.1:{self._metrics_port.port}/metrics"

    @property
    def metrics_token(self) -> str:
        """The bearer token /metrics requires where deploy/ runs it (empty: the emulated stack's needs none)."""
        return self.real.metrics_token if self.real is not None else ""

    @property
    def kube(self) -> KubeClient:
        if self._kube is None:
            raise RuntimeError("the cluster is not started")
        return self._kube

    def kube_settings(self) -> KubeSettings:
        return KubeSettings(kubeconfig=str(self.config.kubeconfig), kube_backoff_initial=0.05, kube_backoff_max=1.0)

    # --- the services ---------------------------------------------------------------------------------

    # The services' settings are deploy/'s (hami_sim.deployed.deployed_settings): only places are mapped here.
    def webhook_settings(self) -> WebhookSettings:
        if self.tls is None:
            raise RuntimeError("the cluster is not started")
        return deployed_settings(
            WebhookSettings,
            "hami-webhook",
            "webhook",
            mapped={
                "nats_url": self.nats.url,
                "kubeconfig": self._kubeconfig_of("webhook"),
                "host": "127.0.0.1",
                "port": self._webhook_port.port,
                "tls_cert_file": str(self.tls.cert),
                "tls_key_file": str(self.tls.key),
                "device_config_file": self.config.service_device_config(),
            },
        )

    def extender_settings(self) -> ExtenderSettings:
        return deployed_settings(
            ExtenderSettings,
            "hami-scheduler",
            "extender",
            mapped={
                "nats_url": self.nats.url,
                "http_host": "127.0.0.1",
                "http_port": self._extender_port.port,
                "kubeconfig": str(self.config.kubeconfig),
                "identity": "hami-extender-local",
                "grant_key_file": str(self.config.grant_key_file),
                "device_config_file": self.config.service_device_config(),
                # what this stack is asked to run, and a first sync that waits out a loaded test machine
                "node_scheduler_policy": self.config.node_policy,
                "gpu_scheduler_policy": self.config.gpu_policy,
                "placement_replicas": self.config.nats_servers,
                "sync_wait": 10.0,
            },
            # the scheduler stand-in calls the extender over loopback HTTP (kube-scheduler's HTTPS: the real stack)
            away=("HAMI_TLS_CERT_FILE", "HAMI_TLS_KEY_FILE"),
        )

    def metrics_settings(self) -> MetricsSettings:
        return deployed_settings(
            MetricsSettings,
            "hami-metrics",
            "metrics",
            mapped={"nats_url": self.nats.url, "http_host": "127.0.0.1", "http_port": self._metrics_port.port},
        )

    # Each body runs under its service's service.name (one process holds them all; a collector shows them apart).
    async def _run_webhook(self, stop: asyncio.Event) -> None:
        settings = self.webhook_settings()
        with service_scope(settings.service_name):
            await serve_webhook(create_webhook(settings), settings, stop, self._webhook_port.socket())

    async def _run_extender(self, stop: asyncio.Event) -> None:
        def started(state: Mapping[str, Any]) -> None:
            self._extender_state = state

        settings = self.extender_settings()
        with service_scope(settings.service_name):
            await serve_app(create_extender(settings), self._extender_port.socket(), stop, started)

    async def _run_metrics(self, stop: asyncio.Event) -> None:
        settings = self.metrics_settings()
        with service_scope(settings.service_name):
            await serve_app(create_metrics(settings), self._metrics_port.socket(), stop)

    async def _run_scheduler(self, stop: asyncio.Event) -> None:
        driver = SchedulerDriver(
            self.kube,
            self.extender_url,
            retry_after=self.config.retry_after,
            managed=self._managed(),
        )
        self.driver = driver
        async with asyncio.TaskGroup() as tg:
            running = tg.create_task(driver.run(), name="scheduler")
            await stop.wait()
            running.cancel()

    def _managed(self) -> tuple[ManagedResource, ...]:
        """The deployed extender's managedResources, NVIDIA's names as the stack's device config spells them:
        HAMi's chart renders both from one set of values, so a renamed resource is renamed in both."""
        names = self.config.device_config().resources
        renamed = {
            GPU: names.count_name,
            GPU_MEMORY: names.memory_name,
            GPU_MEMORY_PERCENTAGE: names.memory_percentage_name,
            GPU_CORES: names.core_name,
            GPU_PRIORITY: names.priority_name,
        }
        deployed_ones = managed_resources(self._documents)
        return tuple(msgspec.structs.replace(r, name=renamed.get(r.name, r.name)) for r in deployed_ones)

    async def _run_pod_watch(self, stop: asyncio.Event) -> None:
        """The kubelets' view of the pods: one watch for every node, handing each bound pod to its node."""
        cache = WatchCache(pod_source(self.kube), name="kubelet pods")
        cache.add_handler(lambda change: hand_over(self.nodes, change))
        async with asyncio.TaskGroup() as tg:
            watching = tg.create_task(cache.run(), name="kubelet pod watch")
            await stop.wait()
            watching.cancel()

    def _admitted(self, admitted: Admitted) -> None:
        self.admitted[admitted.admission.uid] = admitted
        for callback in self.on_admitted:
            callback(admitted)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- lifecycle ------------------------------------------------------------------------------------

    def _service(self, name: str, body: Callable[[asyncio.Event], Any], tasks: asyncio.TaskGroup) -> RunningService:
        service = RunningService(name, body, tasks)
        self._services.append(service)
        return service

    def _seed_nodes(self) -> None:
        for name in self.config.node_names():
            devices = str(self.config.gpus_on(name) * self.config.node_split(name))
            # what kube-scheduler's own plugins check (NodeResourcesFit counts pods against allocatable pods)
            machine = {"cpu": "64", "memory": "512Gi", "pods": "250", self.config.gpu_resource: devices}
            # kubelet reports the resources other vendors' plugins serve; Cambricon's MLUs exist only there
            machine.update(vendor_capacity(self.config, name))
            body: Json = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "gpu": "on"}},
                "status": {
                    "capacity": machine,
                    "allocatable": machine,
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
            if self.config.taint_mig_nodes and name in self.config.mig_node_names():
                body["spec"] = {"taints": [dict(MIG_TAINT)]}
            self.api.create("", "v1", "nodes", None, body)

    async def _start_nodes(self, connections: NodeConnections, tasks: asyncio.TaskGroup) -> None:
        for name in self.config.node_names():
            node = SimNode(name, self.config, connections, tasks, self._admitted, self.kube)
            self.nodes[name] = node
            await node.start()
            self._services.extend((node.admitter, node.allocator, node.agent))
        self.pod_watch = self._service("kubelet pod watch", self._run_pod_watch, tasks)
        self.pod_watch.start()
        async with asyncio.timeout(_READY_TIMEOUT_S):
            await asyncio.gather(*(node.wait_ready() for node in self.nodes.values()))

    async def _start_hosts(self, connections: NodeConnections) -> None:
        names = list(self.config.node_names())
        count = min(self.config.node_hosts, len(names))
        self.hosts = [NodeHost(self.config, names[i::count], connections, self._admitted) for i in range(count)]
        await asyncio.gather(*(host.start() for host in self.hosts))

    async def start(self, progress: Callable[[str], None] = log.info) -> Self:
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="stack")
        loop.set_default_executor(executor)
        self.config.workdir.mkdir(parents=True, exist_ok=True)
        self.config.sockdir.mkdir(parents=True, exist_ok=True)
        write_inventory(self.config)
        write_grant_key(self.config)
        self.tls = write_serving_certificate(self.config.workdir / "tls")
        if self.real is not None:
            await self._start_deployed(self.real, progress)
        else:
            await self._start_emulated(progress)
        progress("ready")
        return self

    def _node_labels(self) -> dict[str, dict[str, str]]:
        return {name: {"kubernetes.io/hostname": name, "gpu": "on"} for name in self.config.node_names()}

    async def _start_deployed(self, real: RealKube, progress: Callable[[str], None]) -> None:
        """deploy/ as shipped on the real control plane: the rendered objects, then the pods in the order a
        cluster brings them up (NATS, the control plane's pods, the node pods beside their kubelets)."""
        stack = self._stack
        progress(f"starting etcd and kube-apiserver {real.binaries.version}; applying deploy/ as rendered; NATS")
        stack.callback(real.close)
        await asyncio.to_thread(real.start_plane, self._node_labels())
        await asyncio.to_thread(self._seed_nodes)
        self._kube = await stack.enter_async_context(KubeClient.from_settings(self.kube_settings()))
        tasks = await stack.enter_async_context(asyncio.TaskGroup())
        stack.push_async_callback(self._stop_services)
        replicas = max(self.config.scheduler_replicas, 1)
        progress(f"starting the webhook, the metrics service and {replicas} scheduler pod(s) as deploy/ runs them")
        await asyncio.to_thread(real.start_control)
        progress(f"starting {self._nodes_phrase()}: a hami-node pod and a kubelet each")
        names = list(self.config.node_names())
        await asyncio.to_thread(real.prepare_nodes, names)
        for name in names:
            pod = real.node_pod(name)
            launched = LaunchedNode(
                plugin_dir=real.node_plugin_dir(name),
                staging_dir=real.node_staging_dir(name),
                pod_resources=real.node_pod_resources(name),
                agent=ProcessService(f"nodeagent/{name}", pod.container("nodeagent")),
                allocator=ProcessService(f"allocator/{name}", pod.container("allocator")),
            )
            node = SimNode(name, self.config, self._connections(), tasks, self._admitted, self.kube, launched=launched)
            self.nodes[name] = node
            await node.start()
            self._services.extend((node.admitter, node.allocator, node.agent))
        self.pod_watch = self._service("kubelet pod watch", self._run_pod_watch, tasks)
        self.pod_watch.start()
        # each deployed node is two Python processes of its own starting on the same cores: at 100 nodes on
        # two cores that alone takes minutes, so the wait grows with the nodes
        ready_s = _READY_TIMEOUT_S + _READY_PER_DEPLOYED_NODE_S * len(self.nodes)
        async with asyncio.timeout(ready_s):
            await asyncio.gather(*(node.wait_ready() for node in self.nodes.values()))
        progress("device plugins registered; waiting for the nodes' GPU registration")
        await eventually(self._ledger_complete, timeout=ready_s, what="every node registered")
        progress("registering the webhook with kube-apiserver; waiting for a kube-scheduler to lead")
        await asyncio.to_thread(real.register_webhook)
        await asyncio.to_thread(real.wait_leader)
        self._admitter = Admitter(self.api.url, api_tls=real.plane.client_tls())
        stack.push_async_callback(self._admitter.close)

    def _connections(self) -> NodeConnections:
        return NodeConnections(
            nats_url=self.nats.url,
            kubeconfig=str(self.config.kubeconfig),
            kubelet_kubeconfig=str(self.config.kubeconfig),
        )

    def _nodes_phrase(self) -> str:
        mig = self.config.mig_nodes
        extra = f" and {mig} MIG node{'s' if mig > 1 else ''} × {self.config.mig_gpus_per_node} GPUs" if mig else ""
        vendors = self.config.other_vendors
        if vendors:
            extra += f" and a node of {self.config.vendor_devices_per_node} devices for each of {', '.join(vendors)}"
        return f"{self.config.nodes} nodes × {self.config.gpus_per_node} GPUs{extra}"

    async def _start_emulated(self, progress: Callable[[str], None]) -> None:
        stack = self._stack
        assert self.tls is not None
        progress("starting nats-server and the Kubernetes API emulator")
        assert not isinstance(self.nats, LaunchedNats)
        await asyncio.to_thread(self.nats.start)
        stack.callback(self.nats.close)
        stack.callback(self.api.close)
        await asyncio.to_thread(self.api.start)
        self.api.write_kubeconfig(self.config.kubeconfig)
        self._documents = await asyncio.to_thread(deployed)
        await asyncio.to_thread(self._seed_nodes)
        self._kube = await stack.enter_async_context(KubeClient.from_settings(self.kube_settings()))
        tasks = await stack.enter_async_context(asyncio.TaskGroup())
        stack.push_async_callback(self._stop_services)
        progress("starting the webhook, the extender and the metrics service")
        self.webhook = self._service("webhook", self._run_webhook, tasks)
        self.metrics = self._service("metrics", self._run_metrics, tasks)
        for service in (self.webhook, self.metrics):
            service.start()
        self.extender = self._service("extender", self._run_extender, tasks)
        self.extender.start()
        connections = NodeConnections(
            nats_url=self.nats.url,
            kubeconfig=self._kubeconfig_of("node"),
            kubelet_kubeconfig=str(self.config.kubeconfig),
        )
        progress(f"starting {self._nodes_phrase()}")
        if self.config.node_hosts > 0:
            await self._start_hosts(connections)
        else:
            await self._start_nodes(connections, tasks)
        progress("device plugins registered; waiting for the nodes' GPU registration")
        await eventually(self._ledger_complete, timeout=_READY_TIMEOUT_S, what="every node registered")
        self.scheduler = self._service("scheduler", self._run_scheduler, tasks)
        self.scheduler.start()
        self._admitter = Admitter(self.api.url)
        stack.push_async_callback(self._admitter.close)
        progress("registering the webhook with the API emulator")
        # the deployed configuration, as the real stack registers it with kube-apiserver: the emulator calls it
        config = webhook_configuration(self._documents, self.webhook_url, self.tls.ca.read_bytes())
        await asyncio.to_thread(
            self.api.create, "admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", None, config
        )
        await eventually(self._webhook_routes, timeout=_READY_TIMEOUT_S, what="the emulator calls the webhook")

    async def _webhook_routes(self) -> bool:
        """A dry-run GPU pod comes back routed to hami-scheduler: the apiserver calls the webhook, which answers."""
        assert self._admitter is not None
        return await self._admitter.routes_to(DEFAULT_SCHEDULER_NAME, self.config.gpu_resource)

    def ledger(self) -> Ledger | None:
        ledger = self._extender_state.get("ledger")
        return ledger if isinstance(ledger, Ledger) else None

    def _ledger_complete(self) -> bool:
        if self.real is not None:
            return self.real.extenders_ready()
        ledger = self.ledger()
        return ledger is not None and all(name in ledger for name in self.config.node_names())

    async def _stop_services(self) -> None:
        """Scheduler first; then NATS, so no service waits out a drain; then the nodes and the control plane."""
        first = [s for s in self._services if s in (self.scheduler, self.pod_watch)]
        if self.real is not None:
            await asyncio.to_thread(self.real.stop_schedulers)
        for service in first:
            await service.stop()
        # NATS goes first on purpose, so each client's "unexpected EOF" and refused reconnects that follow are
        # expected, not news: one line says so instead of dozens of warnings (errors still show).
        bus_log = logging.getLogger(EmbeddedNats.__module__.rsplit(".", 1)[0])
        level = bus_log.level
        log.info("stopping NATS before the services: their disconnect warnings are silenced until they stop")
        bus_log.setLevel(max(level, logging.ERROR))
        try:
            await asyncio.to_thread(self.nats.stop)
            nodes = [s for node in self.nodes.values() for s in (node.admitter, node.allocator, node.agent)]
            await asyncio.gather(*(s.stop() for s in nodes), *(host.stop() for host in self.hosts))
            await asyncio.gather(*(s.stop() for s in self._services if s not in first and s not in nodes))
            await asyncio.gather(*(node.kubelet.stop() for node in self.nodes.values()))
        finally:
            bus_log.setLevel(level)
        for port in (self._metrics_port, self._webhook_port, self._extender_port):
            port.close()

    async def close(self) -> None:
        await self._stack.aclose()
        for node in self.config.mig_node_names():  # the fake MIG driver's state lives outside the workdir
            discard_state(default_state_file(self.config.inventory_file, node))

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- using it -------------------------------------------------------------------------------------

    async def submit(self, pod: Json) -> Json:
        """Create ``pod`` as a user does (the apiserver calls the webhook); returns the stored pod. A pod the
        webhook refuses raises AdmissionDenied with the apiserver's message."""
        if self._admitter is None:
            raise RuntimeError("the cluster is not started")
        started = time.monotonic()
        created = await self._admitter.create(pod)
        self.submitted_at[created["metadata"]["uid"]] = started
        return created

    async def wait_admitted(self, uids: Iterable[str]) -> dict[str, Admitted]:
        wanted = set(uids)
        async with self._changed:
            await self._changed.wait_for(lambda: wanted <= self.admitted.keys())
        return {uid: self.admitted[uid] for uid in wanted}

    def verdict(self, uid: str) -> Verdict | None:
        return None if self.driver is None else self.driver.verdicts.get(uid)

    def capacity(self) -> dict[str, GpuCapacity]:
        """Every simulated GPU's UUID and what it can hold."""
        mib = self.config.gpu_memory_mib
        return {
            gpu_uuid(n, i): GpuCapacity(memory_mib=mib, slots=self.config.node_split(n))
            for n in self.config.node_names()
            for i in range(self.config.gpus_on(n))
        }

    def processes(self) -> dict[str, int]:
        """Every process of the stack by name (for CPU accounting): this one (webhook, metrics, the submitting
        client, in-process nodes), NATS, the API emulator or etcd, kube-apiserver, kube-scheduler and extender
        replicas, and the node hosts."""
        found = {"stack (webhook, metrics, client)": os.getpid()}
        peers: list[tuple[str, int | None]] = [("nats-server", self.nats.pid)]
        if self.real is not None:
            plane = self.real.plane
            peers = [("etcd", plane.etcd.pid), ("kube-apiserver", plane.apiserver.pid), *self.real.processes()]
        elif isinstance(self.api, KubeApiProcess):
            peers.append(("api emulator", self.api.pid))
        peers += [(f"node host {i}", host.pid) for i, host in enumerate(self.hosts)]
        found.update((name, pid) for name, pid in peers if pid is not None)
        return found

    def failures(self) -> dict[str, list[BaseException | str]]:
        found: dict[str, list[BaseException | str]] = {s.name: list(s.failures) for s in self._services if s.failures}
        for host in self.hosts:
            for service, errors in host.failures.items():
                found.setdefault(service, []).extend(errors)
        return found

    # --- chaos ----------------------------------------------------------------------------------------

    async def restart_nats(self) -> None:
        await asyncio.to_thread(self.nats.restart)

    async def kill_nats_server(self, index: int = 0, down_s: float = 5.0) -> None:
        """SIGKILL one server of the NATS cluster, as a lost node; it comes back ``down_s`` later."""
        if not isinstance(self.nats, NatsCluster | LaunchedNats) or self.config.nats_servers < 2:
            raise RuntimeError("one NATS server: nothing survives its loss (nats_servers=3 for a cluster)")
        await asyncio.to_thread(self.nats.kill, index)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(self.nats.revive, index)

    async def restart_extender(self) -> None:
        if self.real is not None:  # the leading replica's process, killed as a crash would
            await asyncio.to_thread(self.real.restart_leader_extender)
            return
        self._extender_state = {}
        await self.extender.restart()

    async def restart_nodeagent(self, node: str) -> None:  # a launched node's is its pod's container
        host = next((h for h in self.hosts if node in h.nodes), None)
        if host is not None:
            await host.restart_agent(node)
        else:
            await self.nodes[node].agent.restart()

    async def restart_api(self) -> None:
        """Restart the API emulator (every watch breaks) and compact its history (resumes get 410 Gone); on
        the real control plane, restart kube-apiserver (etcd keeps every object)."""
        await asyncio.to_thread(self.api.restart)
        if isinstance(self.api, KubeApiProcess):
            await asyncio.to_thread(self.api.compact)
