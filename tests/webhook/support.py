"""Helpers of the webhook tests: real-shaped pods and AdmissionReviews, TLS material, a served webhook."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hami_webhook.app import create_app
from hami_webhook.review import ADMISSION_V1
from hami_webhook.server import serve
from hami_webhook.settings import WebhookSettings

Json = dict[str, Any]


def container(
    name: str = "main",
    *,
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    env: list[Json] | None = None,
    privileged: bool | None = None,
) -> Json:
    """A container as the apiserver sends it (defaults filled in, quantities as strings)."""
    ctr: Json = {
        "name": name,
        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        "resources": {},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    if limits is not None:
        ctr["resources"]["limits"] = dict(limits)
    if requests is not None:
        ctr["resources"]["requests"] = dict(requests)
    if env is not None:
        ctr["env"] = list(env)
    if privileged is not None:
        ctr["securityContext"] = {"privileged": privileged}
    return ctr


def pod(
    *containers: Json,
    init: tuple[Json, ...] = (),
    name: str = "gpu-pod",
    namespace: str = "default",
    scheduler: str | None = "default-scheduler",
    node_name: str = "",
    annotations: dict[str, str] | None = None,
    runtime_class: str | None = None,
) -> Json:
    spec: Json = {
        "containers": list(containers) or [container()],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "securityContext": {},
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
    }
    if init:
        spec["initContainers"] = list(init)
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node_name:
        spec["nodeName"] = node_name
    if runtime_class is not None:
        spec["runtimeClassName"] = runtime_class
    meta: Json = {"name": name, "namespace": namespace, "labels": {"app": "cuda"}}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "spec": spec, "status": {}}


def review(
    obj: Json | None,
    *,
    operation: str = "CREATE",
    old: Json | None = None,
    user: str = "alice",
    uid: str = "705ab4f5-6393-11e8-b7cc-42010a800002",
    api_version: str = ADMISSION_V1,
    namespace: str | None = None,
) -> Json:
    """An AdmissionReview request as the apiserver sends it for pods."""
    ns = namespace if namespace is not None else (obj or old or {}).get("metadata", {}).get("namespace", "default")
    request: Json = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": (obj or old or {}).get("metadata", {}).get("name", ""),
        "namespace": ns,
        "operation": operation,
        "userInfo": {"username": user, "uid": "u-1", "groups": ["system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    return {"kind": "AdmissionReview", "apiVersion": api_version, "request": request}


def response_of(body: bytes | str) -> Json:
    answer = json.loads(body)
    assert answer["kind"] == "AdmissionReview"
    result: Json = answer["response"]
    return result


def patch_ops(response: Json) -> list[Json]:
    if "patch" not in response:
        assert "patchType" not in response
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[Json] = json.loads(base64.b64decode(response["patch"]))
    return ops


def patched(original: Json, response: Json) -> Json:
    """The pod the apiserver would store: the original with the returned JSON Patch applied."""
    result: Json = jsonpatch.apply_patch(original, patch_ops(response))
    return result


# --- TLS ---------------------------------------------------------------------------------------------------


def write_self_signed(cert_path: Path, key_path: Path, common_name: str = "hami-webhook.hami-system.svc") -> int:
    """A self-signed certificate for 127.0.0.1 and localhost (in the SAN); returns its serial number."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    serial = x509.random_serial_number()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return serial


# --- a served webhook --------------------------------------------------------------------------------------


@dataclass
class ServedWebhook:
    url: str
    client: httpx.Client

    def post(self, body: Json | bytes, *, path: str = "/webhook?timeout=10s", **kwargs: Any) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers = kwargs.pop("headers", {"content-type": "application/json"})
        return self.client.post(self.url + path, content=content, headers=headers, **kwargs)

    def admit(self, body: Json) -> Json:
        answer = self.post(body)
        assert answer.status_code == 200, answer.text
        return response_of(answer.content)


@contextmanager
def served(
    settings: WebhookSettings, cert_file: Path, client_cert: tuple[Path, Path] | None = None
) -> Iterator[ServedWebhook]:
    """The real app, served by uvicorn over TLS on a free loopback port in a thread of its own; the client
    presents ``client_cert`` (certificate, key) when given (a webhook with a client CA requires one)."""
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only when the proto says TCP
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve(create_app(settings), settings, stop, sock=sock))
        except BaseException as err:
            failure.append(err)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="webhook", daemon=True)
    thread.start()
    url = f"https://127.0.0.1:{port}"
    try:
        # TCP_NODELAY: without it a request sent in two writes waits for the server's delayed ACK
        verify = ssl.create_default_context(cafile=str(cert_file))
        if client_cert is not None:
            verify.load_cert_chain(str(client_cert[0]), str(client_cert[1]))
        transport = httpx.HTTPTransport(
            verify=verify,
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )
        with httpx.Client(transport=transport, timeout=30.0) as client:
            assert client.get(url + "/healthz").status_code == 200  # waits for the lifespan
            yield ServedWebhook(url, client)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        sock.close()
    assert not failure, failure
