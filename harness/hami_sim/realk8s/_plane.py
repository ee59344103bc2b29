"""A real Kubernetes control plane on loopback: etcd and kube-apiserver, built from their own Go modules.

The surface is the API emulator's where the stack uses it (start, stop, restart with state kept,
kubeconfig, seeding with ``create``), so the local stack and the tests run on either. What differs is
real: TLS with a CA made here, x509 and ServiceAccount-token authentication, ``Node,RBAC``
authorisation, the default admission plugins (webhooks included) less the two that need
kube-controller-manager (ServiceAccount, which wants a ``default`` account in every namespace, and
TaintNodesByCondition, whose not-ready taint only the node lifecycle controller removes).
"""

from __future__ import annotations

import http.client
import json
import logging
import shutil
import ssl
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from hami_sim.net import listening_socket
from hami_sim.realk8s._binaries import K8sBinaries, find_binaries
from hami_sim.realk8s._peer import Peer
from hami_sim.tls import CertificateAuthority, TlsFiles

__all__ = ["ADMIN_USER", "SYSTEM_NAMESPACE", "ApiError", "ControlPlane", "free_port"]

log = logging.getLogger(__name__)

ADMIN_USER: Final = "kubernetes-admin"
SYSTEM_NAMESPACE: Final = "hami-system"  # where deploy/ puts the services' accounts and Leases
_READY_TIMEOUT_S: Final = 120.0
_PORT_TRIES: Final = 3  # starts of a peer that lost its free port to another process before it bound it
_ISSUER: Final = "https://kubernetes.default.svc.cluster.local"
Json = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


def free_port() -> int:
    with listening_socket("127.0.0.1", 0) as sock:
        port: int = sock.getsockname()[1]
        return port


def _write_service_account_keys(folder: Path) -> tuple[Path, Path]:
    key_file, pub_file = folder / "sa.key", folder / "sa.pub"
    if not key_file.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        key_file.chmod(0o600)
        pub_file.write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
    return key_file, pub_file


def kubeconfig_document(server: str, ca_file: Path, user: Json, namespace: str = "default") -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "hami-real", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [
            {"name": "hami-real", "context": {"cluster": "hami-real", "user": "user", "namespace": namespace}}
        ],
        "current-context": "hami-real",
    }


class ControlPlane:
    """etcd + kube-apiserver in ``workdir`` (a temporary folder by default, removed on ``close``)."""

    def __init__(self, workdir: Path | None = None, binaries: K8sBinaries | None = None) -> None:
        self.binaries = binaries or find_binaries()
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="hami-k8s-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.ca = CertificateAuthority(self.workdir / "pki", name="hami kubernetes CA")
        self.serving = self.ca.serving(
            "apiserver",
            ("127.0.0.1", "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "10.0.0.1"),
            common="kube-apiserver",
        )
        self.admin = self.ca.client("admin", ADMIN_USER, ("system:masters",))
        sa_key, sa_pub = _write_service_account_keys(self.workdir / "pki")
        self.port = free_port()
        etcd_port, peer_port = free_port(), free_port()
        logs = self.workdir / "logs"
        etcd_argv = [
            self.binaries["etcd"],
            "--name=hami",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=hami=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync=true",
            "--auto-compaction-retention=1",
            f"--quota-backend-bytes={8 << 30}",
            "--log-level=warn",
        ]
        self.etcd = Peer("etcd", etcd_argv, logs / "etcd.log")
        self._etcd_url = f"http://127.0.0.1:{etcd_port}"
        apiserver_argv = [
            self.binaries["kube-apiserver"],
            f"--etcd-servers={self._etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.port}",
            f"--tls-cert-file={self.serving.cert}",
            f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.ca.cert_file}",
            f"--service-account-issuer={_ISSUER}",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--authorization-mode=Node,RBAC",
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--v=1",
        ]
        # its graceful termination drains requests in milliseconds here, then can linger for long; 5 s is ample
        self.apiserver = Peer("kube-apiserver", apiserver_argv, logs / "kube-apiserver.log", stop_timeout=5.0)
        self._ssl = self.client_tls()
        self._bootstrapped = False

    # --- addresses and credentials ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.apiserver.running

    def kubeconfig(self, namespace: str = "default", credentials: TlsFiles | None = None) -> Json:
        who = credentials or self.admin
        user = {"client-certificate": str(who.cert), "client-key": str(who.key)}
        return kubeconfig_document(self.url, self.ca.cert_file, user, namespace)

    def client_tls(self, credentials: TlsFiles | None = None) -> ssl.SSLContext:
        """A TLS context that trusts this apiserver and presents ``credentials`` (default: the admin's)."""
        who = credentials or self.admin
        context = ssl.create_default_context(cafile=str(self.ca.cert_file))
        context.load_cert_chain(str(who.cert), str(who.key))
        return context

    def write_kubeconfig(self, path: Path | str, credentials: TlsFiles | None = None) -> Path:
        return _write_yaml(Path(path), self.kubeconfig(credentials=credentials))

    def write_token_kubeconfig(self, path: Path | str, token: str) -> Path:
        return _write_yaml(Path(path), kubeconfig_document(self.url, self.ca.cert_file, {"token": token}))

    def token(
        self, namespace: str, account: str, seconds: int = 86_400, *, node: str = "", audiences: Sequence[str] = ()
    ) -> str:
        """A token for ServiceAccount ``namespace/account`` from the TokenRequest API, as a kubelet gets one.

        With ``node``, the token is bound to that Node object: the apiserver then authenticates it with the
        extra ``authentication.kubernetes.io/node-name``, as it does a DaemonSet pod's projected token."""
        spec: Json = {"expirationSeconds": seconds}
        if audiences:
            spec["audiences"] = list(audiences)
        if node:
            uid = self.request("GET", f"/api/v1/nodes/{node}")["metadata"]["uid"]
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
        token: str = self.request("POST", path, body)["status"]["token"]
        return token

    # --- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> Self:
        if not self.etcd.running:
            self._start_peer(self.etcd, self._etcd_healthy, self._new_etcd_ports)
        if not self.apiserver.running:
            self._start_peer(self.apiserver, self._apiserver_ready, self._new_apiserver_port)
        if not self._bootstrapped:
            self.ensure_namespace(SYSTEM_NAMESPACE)
            self._bootstrapped = True
        return self

    def stop(self) -> None:
        self.apiserver.stop()

    def restart(self) -> None:
        """Restart kube-apiserver on the same port; etcd keeps every object (every watch breaks)."""
        self.apiserver.stop()
        self.start()

    def restart_etcd(self) -> None:
        self.apiserver.stop()
        self.etcd.stop()  # SIGTERM: with --unsafe-no-fsync a SIGKILL could lose the last writes
        self.start()

    def close(self) -> None:
        self.apiserver.stop()
        self.etcd.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _start_peer(self, peer: Peer, ready: Callable[[], bool], new_ports: Callable[[], None]) -> None:
        """Start ``peer`` and wait for it; a first start that lost its port to another process between
        free_port() and the bind ("address already in use": seen in CI) is tried again on new ports."""
        for attempt in range(_PORT_TRIES):
            peer.start()
            try:
                self._wait(ready, peer.name, peer)
                return
            except RuntimeError:
                if self._bootstrapped or attempt + 1 == _PORT_TRIES or "address already in use" not in peer.tail(20):
                    raise
                log.info("%s lost its port to another process; starting it on new ports", peer.name)
                new_ports()

    def _new_etcd_ports(self) -> None:
        shutil.rmtree(self.workdir / "etcd", ignore_errors=True)  # a first start only: nothing is stored yet
        etcd_port, peer_port = free_port(), free_port()
        self._etcd_url = f"http://127.0.0.1:{etcd_port}"
        flags = {
            "--listen-client-urls": self._etcd_url,
            "--advertise-client-urls": self._etcd_url,
            "--listen-peer-urls": f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls": f"http://127.0.0.1:{peer_port}",
            "--initial-cluster": f"hami=http://127.0.0.1:{peer_port}",
        }
        _set_flags(self.etcd.argv, flags)
        _set_flags(self.apiserver.argv, {"--etcd-servers": self._etcd_url})

    def _new_apiserver_port(self) -> None:
        self.port = free_port()
        _set_flags(self.apiserver.argv, {"--secure-port": str(self.port)})

    def _wait(self, ready: Callable[[], bool], what: str, peer: Peer) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not peer.running:
                raise RuntimeError(f"{what} exited at start: {peer.tail(20)}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{what} not ready in {_READY_TIMEOUT_S:.0f} s: {peer.tail(20)}")

    def _etcd_healthy(self) -> bool:
        conn = http.client.HTTPConnection("127.0.0.1", int(self._etcd_url.rsplit(":", 1)[1]), timeout=2)
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            return response.status == 200 and b'"true"' in response.read()
        except OSError:
            return False
        finally:
            conn.close()

    def _apiserver_ready(self) -> bool:
        try:
            status, _ = self._exchange("GET", "/readyz", None)
        except OSError:
            return False
        return status == 200

    # --- requests as the admin -----------------------------------------------------------------------------

    def _exchange(
        self,
        method: str,
        path: str,
        body: Json | None,
        content_type: str = "application/json",
        token: str = "",
        accept: str = "application/json",
    ) -> tuple[int, bytes]:
        context = self._ssl if not token else ssl.create_default_context(cafile=str(self.ca.cert_file))
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=context, timeout=30)
        try:
            headers = {"Accept": accept}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            payload = None
            if body is not None:
                payload = json.dumps(body).encode()
                headers["Content-Type"] = content_type
            conn.request(method, path, body=payload, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def request(self, method: str, path: str, body: Json | None = None, content_type: str = "application/json") -> Json:
        return self.request_as("", method, path, body, content_type)

    def request_as(
        self, token: str, method: str, path: str, body: Json | None = None, content_type: str = "application/json"
    ) -> Json:
        """A request with a bearer ``token`` (empty: as the admin, by client certificate)."""
        status, data = self._exchange(method, path, body, content_type, token)
        if status >= 300:
            raise ApiError(status, data.decode(errors="replace"))
        decoded: Json = json.loads(data) if data else {}
        return decoded

    def metrics_text(self) -> str:
        """kube-apiserver's own ``/metrics`` (Prometheus text), read as the admin: what it counted itself."""
        status, data = self._exchange("GET", "/metrics", None, accept="text/plain")
        if status != 200:
            raise ApiError(status, data.decode(errors="replace"))
        return data.decode()

    def create(self, group: str, version: str, plural: str, namespace: str | None, body: Json) -> Json:
        """Create ``body`` as the admin (seeding a cluster); returns the stored object."""
        base = f"/api/{version}" if group == "" else f"/apis/{group}/{version}"
        where = f"/namespaces/{namespace}" if namespace else ""
        stored = self.request("POST", f"{base}{where}/{plural}", body)
        if plural == "nodes" and body.get("status"):
            # a Node is created with its status, but the apiserver keeps only what /status writes later
            name = stored["metadata"]["name"]
            stored = self.request(
                "PATCH", f"/api/v1/nodes/{name}/status", {"status": body["status"]}, "application/merge-patch+json"
            )
        return stored

    def ensure_namespace(self, name: str) -> None:
        try:
            self.create(
                "", "v1", "namespaces", None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            )
        except ApiError as err:
            if err.status != 409:
                raise


def _set_flags(argv: list[str], flags: Mapping[str, str]) -> None:
    """Give each ``--flag=value`` of ``argv`` named in ``flags`` its new value, in place."""
    for index, arg in enumerate(argv):
        name = arg.split("=", 1)[0]
        if name in flags:
            argv[index] = f"{name}={flags[name]}"


def _write_yaml(path: Path, document: Json) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(document, sort_keys=False))
    tmp.replace(path)
    return path
