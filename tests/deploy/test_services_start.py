"""The control-plane services started exactly as the dev overlay configures them: the environment and
Secret volumes a kubelet would give each container, the deployed NATS configuration with the generated
passwords, a Kubernetes API (the emulator) in place of the cluster's. What the apiserver, kube-scheduler
and Prometheus would do next is done here: verify the certificate by the name they dial, and call."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sysconfig
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx
import msgspec
import nats
import nkeys
import pytest
import yaml
from nats.aio.msg import Msg

from hami_common import subjects
from hami_common.bus import Bus
from hami_common.errors import InvalidInput
from hami_common.events import AdmissionEvent, NodeInventory
from hami_common.resources import GPU, GPU_MEMORY
from hami_common.settings import BusSettings
from hami_natsauth.responder import Authorizer
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.kubelet import KubeletEmulator
from hami_sim.waiting import eventually
from tests.deploy.manifests import NAMESPACE, ContainerRef, Rendering
from tests.deploy.natsconf import NatsSecrets, running_nats

Obj = dict[str, Any]
START_S: Final = 60.0  # a cold interpreter on a busy machine; nothing waits this long when all is well
POD_NAME: Final = "hami-pod-0"
NODE_NAME: Final = "gpu-node-1"
WEBHOOK_DNS: Final = f"hami-webhook.{NAMESPACE}.svc"
GPU_LIMITS: Final = {GPU: "1", GPU_MEMORY: "3000"}
POD_TOKEN: Final = "projected-token-of-hami-pod-0"  # what the callout's TokenReview stand-in accepts


Starter = Callable[..., tuple["Service", "Environment"]]


@dataclass(frozen=True, slots=True)
class Environment:
    """What the kubelet would give one container: its variables, and where its Secret volumes are."""

    env: dict[str, str]
    mounts: dict[str, Path]


def kubelet_view(rendering: Rendering, ref: ContainerRef, workdir: Path, host: Path) -> Environment:
    """Resolve the container's env (values, secretKeyRefs, fieldRefs), write its Secret volumes, and put
    its hostPath volumes under ``host`` (a stand-in for the node's root, shared by a pod's containers)."""
    secrets = {s["metadata"]["name"]: s.get("data", {}) for s in rendering.of_kind("Secret")}
    volumes = {v["name"]: v for v in ref.pod_spec.get("volumes") or []}
    mounts: dict[str, Path] = {}
    for mount in ref.container.get("volumeMounts") or []:
        volume = volumes[mount["name"]]
        if "secret" in volume:
            target = workdir / mount["name"]
            target.mkdir(parents=True, exist_ok=True)
            for key, value in secrets[volume["secret"]["secretName"]].items():
                (target / key).write_bytes(base64.b64decode(value))
                (target / key).chmod(0o600)
            mounts[mount["mountPath"]] = target
        elif "projected" in volume:  # a service-account token the kubelet would request for the pod
            target = workdir / mount["name"]
            target.mkdir(parents=True, exist_ok=True)
            for source in volume["projected"]["sources"]:
                if "serviceAccountToken" in source:
                    (target / source["serviceAccountToken"]["path"]).write_text(POD_TOKEN)
            mounts[mount["mountPath"]] = target
        elif "hostPath" in volume:
            target = host / volume["hostPath"]["path"].lstrip("/")
            target.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = target
    fields = {
        "metadata.name": POD_NAME,
        "metadata.namespace": NAMESPACE,
        "spec.nodeName": NODE_NAME,
        "status.podIP": "127.0.0.1",
    }
    env: dict[str, str] = {}
    for entry in ref.container.get("env") or []:
        if "value" in entry:
            # $(NAME) refers to a variable defined earlier in the list, as the kubelet expands it
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(entry["value"]))
            env[entry["name"]] = relocate(value, mounts)
        elif "secretKeyRef" in entry["valueFrom"]:
            ref_ = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = base64.b64decode(secrets[ref_["name"]][ref_["key"]]).decode()
        else:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return Environment(env, mounts)


def relocate(value: str, mounts: dict[str, Path]) -> str:
    """A path inside a mount, or the directory just above one (HAMI_HOOK_PATH=/usr/local for the mount
    /usr/local/vgpu), moved to where the mount really is; any other value unchanged."""
    for path, local in mounts.items():
        if value == path or value.startswith(path + "/"):
            return str(local) + value.removeprefix(path)
        parent = path.rsplit("/", 1)[0]
        if value == parent and local.name == path.rsplit("/", 1)[1]:
            return str(local.parent)
    return value


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Service:
    """One service process, started from its console script with the resolved environment."""

    def __init__(self, command: str, env: dict[str, str], log: Path) -> None:
        script = Path(sysconfig.get_path("scripts")) / command
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(script)], env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"exited with {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> int:
        """SIGTERM, as the kubelet sends it; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"did not stop on SIGTERM:\n{self.log.read_text()[-4000:]}") from None


@pytest.fixture
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator() as api:
        yield api


@pytest.fixture
def dev_passwords(dev: Rendering) -> dict[str, str]:
    secret = dev.get("Secret", "hami-nats-auth")
    return {user: base64.b64decode(value).decode() for user, value in secret["data"].items()}


@pytest.fixture
def nats_tls(tmp_path: Path, dev: Rendering) -> Path:
    """The dev overlay's hami-nats-tls Secret as files: ca.crt is what every client verifies the server by."""
    files = tmp_path / "nats-tls"
    files.mkdir()
    for key, value in dev.get("Secret", "hami-nats-tls")["data"].items():
        (files / key).write_bytes(base64.b64decode(value))
    return files


@pytest.fixture
async def nats_url(tmp_path: Path, dev: Rendering, dev_passwords: dict[str, str], nats_tls: Path) -> AsyncIterator[str]:
    """nats-server as the StatefulSet runs it, its Secrets' values taken from the dev overlay (TLS included),
    with the auth callout answering beside it (a stand-in for TokenReview accepts the pod's token only)."""
    issuer = base64.b64decode(dev.get("Secret", "hami-nats-issuer")["data"]["issuer"]).decode()
    seed = base64.b64decode(dev.get("Secret", "hami-nats-issuer")["data"]["seed"])
    secrets = NatsSecrets(dev_passwords, issuer, nats_tls / "tls.crt", nats_tls / "tls.key")
    with running_nats(tmp_path / "nats", secrets, dev.container("hami-nats", "nats").container["args"]) as url:
        tls_url = url.replace("nats://", "tls://")
        callout = BusSettings(
            nats_url=tls_url,
            nats_user="natsauth",
            nats_password=dev_passwords["natsauth"],
            nats_ca_file=str(nats_tls / "ca.crt"),
            nats_identity="natsauth",
            service_name="natsauth",
        )
        authorizer = Authorizer(PodTokenOnly(), nkeys.from_seed(bytearray(seed)), account="HAMI", ttl_s=3600)
        async with await Bus.connect(callout, give_up_after=START_S) as bus:
            await bus.reply(subjects.AUTH_CALLOUT, authorizer.answer)
            yield tls_url


class PodTokenOnly:
    """Stands in for the TokenReview API: the node pod's projected token proves its node, nothing else does."""

    async def node_of(self, token: str) -> str:
        if token != POD_TOKEN:
            raise InvalidInput("token not authenticated")
        return NODE_NAME


@pytest.fixture
def host() -> Iterator[Path]:
    """The node's root directory for hostPath volumes; short, as unix socket paths are limited."""
    root = Path(tempfile.mkdtemp(prefix="node-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def start(
    tmp_path: Path, dev: Rendering, emulator: KubeApiEmulator, nats_url: str, kubectl: str, host: Path
) -> Iterator[Starter]:
    """start(workload, container, **overrides) -> (Service, Environment), stopped after the test.

    The overlay's Namespace is created first, with kubectl, as ``kubectl apply -k`` would, and the GPU
    node (labelled gpu=on) the node pod runs on."""
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig")
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE_NAME, "labels": {"gpu": "on"}}}
    objects = tmp_path / "objects.json"
    objects.write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": [dev.get("Namespace", NAMESPACE), node]})
    )
    created = subprocess.run(
        [kubectl, "--kubeconfig", str(kubeconfig), "create", "--validate=false", "-f", str(objects)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    started: list[Service] = []

    def _start(workload: str, container: str, **overrides: str) -> tuple[Service, Environment]:
        ref = dev.container(workload, container)
        view = kubelet_view(dev, ref, tmp_path / container, host)
        env = {**view.env, "HAMI_NATS_URL": nats_url, "HAMI_KUBECONFIG": str(kubeconfig), **overrides}
        service = Service(ref.container["command"][0], env, tmp_path / f"{container}.log")
        started.append(service)
        return service, Environment(env, view.mounts)

    yield _start
    for service in started:
        assert service.stop() == 0, service.log.read_text()[-4000:]


async def get_when_up(client: httpx.AsyncClient, service: Service, url: str, **kwargs: Any) -> httpx.Response:
    """GET ``url`` once the service answers it with 200 (the process is polled: no event to await)."""

    async def answered() -> httpx.Response | None:
        service.alive()
        try:
            response = await client.get(url, **kwargs)
        except httpx.TransportError:
            return None
        return response if response.status_code == 200 else None

    return await eventually(answered, timeout=START_S, what=url)


async def listen(url: str, ca: Path, user: str, password: str, subject: str) -> tuple[Any, list[Msg], Any]:
    received: list[Msg] = []
    arrived = asyncio.Event()

    async def on_msg(msg: Msg) -> None:
        received.append(msg)
        arrived.set()

    trust = ssl.create_default_context(cafile=str(ca / "ca.crt"))
    nc = await nats.connect(url, user=user, password=password, tls=trust, inbox_prefix=subjects.inbox_prefix(user))
    await nc.subscribe(subject, cb=on_msg)
    await nc.flush()
    return nc, received, arrived


def admission_review(namespace: str) -> Obj:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gpu-pod", "namespace": namespace, "uid": "0b9c1d7e-1111-4222-8333-444455556666"},
        "spec": {
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {GPU: "1", GPU_MEMORY: "3000"}}}]
        },
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "5f1c2a9e-0000-4000-8000-000000000001",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": pod,
        },
    }


async def test_webhook_serves_the_apiserver_as_registered(
    start: Starter,
    dev: Rendering,
    dev_passwords: dict[str, str],
    nats_url: str,
    nats_tls: Path,
    emulator: KubeApiEmulator,
) -> None:
    async with httpx.AsyncClient() as client:  # the webhook announces reviews of namespaces that exist only
        made = await client.post(f"{emulator.url}/api/v1/namespaces", json={"metadata": {"name": "team-a"}})
    assert made.status_code == 201, made.text
    port = free_port()
    service, _ = start("hami-webhook", "webhook", HAMI_HOST="127.0.0.1", HAMI_PORT=str(port))
    (hook,) = dev.get("MutatingWebhookConfiguration", "hami-webhook")["webhooks"]
    apiserver_trust = ssl.create_default_context(cadata=base64.b64decode(hook["clientConfig"]["caBundle"]).decode())
    service_name = {"sni_hostname": WEBHOOK_DNS}  # the apiserver dials <service>.<namespace>.svc
    nc, received, arrived = await listen(
        nats_url, nats_tls, "metrics", dev_passwords["metrics"], subjects.wildcard(subjects.ADMISSION)
    )
    try:
        async with httpx.AsyncClient(verify=apiserver_trust, timeout=10) as client:
            base = f"https://127.0.0.1:{port}"
            await get_when_up(client, service, f"{base}/readyz", extensions=service_name)
            response = await client.post(
                f"{base}{hook['clientConfig']['service']['path']}?timeout=10s",
                json=admission_review("team-a"),
                extensions=service_name,
            )
        assert response.status_code == 200
        answer = response.json()["response"]
        assert answer["allowed"] is True
        patch = json.loads(base64.b64decode(answer["patch"]))
        assert any(op["path"] == "/spec/schedulerName" and op["value"] == "hami-scheduler" for op in patch)
        async with asyncio.timeout(START_S):
            await arrived.wait()
        event = msgspec.msgpack.decode(received[0].data, type=AdmissionEvent)
        assert (event.namespace, event.allowed) == ("team-a", True)
        assert received[0].subject == subjects.admission("team-a")
    finally:
        await nc.close()


async def test_extender_serves_kube_scheduler_over_verified_https(
    start: Starter, dev: Rendering, emulator: KubeApiEmulator, tmp_path: Path, host: Path
) -> None:
    # kube-scheduler in the same pod holds the hami-scheduler Lease as "<pod name>_<uuid>"; the extender follows it
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "hami-scheduler", "namespace": NAMESPACE},
        "spec": {"holderIdentity": f"{POD_NAME}_0b6c8e2a", "leaseDurationSeconds": 3600},
    }
    async with httpx.AsyncClient() as client:
        made = await client.post(
            f"{emulator.url}/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", json=lease
        )
    assert made.status_code == 201, made.text
    port, probe_port = free_port(), free_port()
    service, _ = start(
        "hami-scheduler",
        "extender",
        HAMI_HTTP_HOST="127.0.0.1",
        HAMI_HTTP_PORT=str(port),
        HAMI_HEALTH_PORT=str(probe_port),
    )
    config = msgspec.yaml.decode(dev.get("ConfigMap", "hami-kube-scheduler")["data"]["config.yaml"])
    (extender,) = config["extenders"]
    # kube-scheduler's files, where the kubelet mounts them in its container: the CA and its client certificate
    scheduler = kubelet_view(dev, dev.container("hami-scheduler", "kube-scheduler"), tmp_path / "kube-scheduler", host)
    tls_config = extender["tlsConfig"]
    kube_scheduler_trust = ssl.create_default_context(cafile=relocate(tls_config["caFile"], scheduler.mounts))
    anonymous = ssl.create_default_context(cafile=relocate(tls_config["caFile"], scheduler.mounts))
    kube_scheduler_trust.load_cert_chain(
        relocate(tls_config["certFile"], scheduler.mounts), relocate(tls_config["keyFile"], scheduler.mounts)
    )
    url = extender["urlPrefix"].rsplit(":", 1)[0] + f":{port}"  # the same host, the test's port
    async with httpx.AsyncClient(verify=kube_scheduler_trust, timeout=10) as client:
        await get_when_up(client, service, f"{url}/healthz")

        async def leading() -> Obj | None:
            ready: Obj = (await client.get(f"{url}/readyz")).json()
            return ready if ready.get("leader") else None

        ready = await eventually(leading, timeout=START_S, what="the extender to follow its kube-scheduler's Lease")
        assert ready["identity"] == POD_NAME
    # mutual TLS (HAMi#3030): a caller without kube-scheduler's certificate does not get past the handshake
    async with httpx.AsyncClient(verify=anonymous, timeout=10) as stranger:
        with pytest.raises(httpx.TransportError):
            await stranger.get(f"{url}/readyz")
    async with httpx.AsyncClient(timeout=10) as kubelet:  # the probes' plain port, as the manifest points them
        assert (await kubelet.get(f"http://127.0.0.1:{probe_port}/healthz")).status_code == 200


async def test_metrics_serves_prometheus_and_reaches_nats_as_its_user(start: Starter, dev: Rendering) -> None:
    port = free_port()
    service, _ = start("hami-metrics", "metrics", HAMI_HTTP_HOST="127.0.0.1", HAMI_HTTP_PORT=str(port))
    async with httpx.AsyncClient(timeout=10) as client:
        base = f"http://127.0.0.1:{port}"

        async def connected() -> Obj | None:
            health = await get_when_up(client, service, f"{base}/healthz")
            body: Obj = health.json()
            return body if body["nats"] == "connected" else None

        await eventually(connected, timeout=START_S, what="metrics connected to NATS")
        anonymous = await client.get(f"{base}/metrics")
        # Prometheus scrapes with the token of the same Secret (docs/deploy.md)
        token = base64.b64decode(dev.get("Secret", "hami-metrics-token")["data"]["token"]).decode()
        scrape = await client.get(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"})
    assert anonymous.status_code == 401
    assert scrape.status_code == 200
    assert "hami_build_info" in scrape.text


FAKE_GPU: Final = "GPU-5e4f0c1a-0000-4000-8000-0000000000aa"


async def test_node_pod_registers_the_device_plugin_and_the_node_gpus(
    start: Starter,
    dev: Rendering,
    host: Path,
    tmp_path: Path,
    nats_url: str,
    nats_tls: Path,
    dev_passwords: dict[str, str],
) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump({"nodes": {NODE_NAME: [{"uuid": FAKE_GPU, "model": "Tesla V100", "memory_mib": 32768}]}})
    )
    nc, received, arrived = await listen(
        nats_url, nats_tls, "metrics", dev_passwords["metrics"], subjects.inventory(NODE_NAME)
    )
    plugin_dir = next(
        v["hostPath"]["path"]
        for v in dev.get("DaemonSet", "hami-node")["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "device-plugins"
    )
    try:
        kubelet_root = host / plugin_dir.lstrip("/")
        async with KubeletEmulator(
            kubelet_root, node=NODE_NAME, pod_resources=kubelet_root.parent / "pod-resources" / "kubelet.sock"
        ) as kubelet:
            # NVML is not here: the declared inventory stands in for it (the one setting changed).
            fake = {"HAMI_INVENTORY": "fake", "HAMI_FAKE_INVENTORY": str(inventory)}
            agent, agent_env = start("hami-node", "nodeagent", **fake)
            plugin, plugin_env = start("hami-node", "allocator", **fake)
            split = int(plugin_env.env.get("HAMI_DEVICE_SPLIT_COUNT", "10"))
            async with asyncio.timeout(START_S):
                await kubelet.wait_registered()
                await kubelet.wait_devices(GPU, split)  # deviceSplitCount virtual devices of the one GPU
                await arrived.wait()
        event = msgspec.msgpack.decode(received[0].data, type=NodeInventory)
        assert [d.id for d in event.devices] == [FAKE_GPU]
        assert agent_env.env["HAMI_STAGING_DIR"] == plugin_env.env["HAMI_STAGING_DIR"], "one staging store"
        agent.alive()
        plugin.alive()
    finally:
        await nc.close()
