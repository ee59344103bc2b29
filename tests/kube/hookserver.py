"""A tiny mutating admission webhook over HTTPS, for the emulator's webhook calls (and kube-apiserver's).

Its answer is chosen by the pod's ``mode`` label: ``patch`` (a JSONPatch adding an annotation and setting
``schedulerName``), ``deny`` (refused with a message), ``deny-code`` (refused with 403 Forbidden),
``bad-patch`` (a patch without its patchType); anything else is allowed unchanged. Every review is recorded
with the path it was posted to.
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from hami_sim.tls import CertificateAuthority

__all__ = ["MUTATED", "HookServer", "closed_port", "hook_server", "webhook"]

Json = dict[str, Any]
MUTATED: Final = "diff.hami.io/mutated"
_PATCH: Final = [
    {"op": "add", "path": "/metadata/annotations", "value": {MUTATED: "yes"}},
    {"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"},
]


def _answer(request: Json) -> Json:
    mode = ((request["object"].get("metadata") or {}).get("labels") or {}).get("mode", "")
    response: Json = {"uid": request["uid"], "allowed": True}
    patch = base64.b64encode(json.dumps(_PATCH).encode()).decode()
    if mode == "patch":
        response.update(patchType="JSONPatch", patch=patch)
    elif mode == "deny":
        response.update(allowed=False, status={"message": "no GPUs for you"})
    elif mode == "deny-code":
        response.update(allowed=False, status={"code": 403, "reason": "Forbidden", "message": "over quota"})
    elif mode == "bad-patch":
        response.update(patch=patch)
    return response


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.path, review))
        answer = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": _answer(review["request"]),
        }
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    seen: list[tuple[str, Json]]


@dataclass
class HookServer:
    url: str
    ca_bundle: str  # base64 of the CA's PEM, as a webhook configuration's caBundle
    server: _Server

    @property
    def seen(self) -> list[tuple[str, Json]]:
        return self.server.seen


@contextmanager
def hook_server(folder: Path) -> Iterator[HookServer]:
    ca = CertificateAuthority(folder)
    tls = ca.serving("hook", ("127.0.0.1",))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(tls.cert), str(tls.key))
    server = _Server(("127.0.0.1", 0), _Handler)
    server.seen = []
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="hook", daemon=True)
    thread.start()
    try:
        yield HookServer(f"https://127.0.0.1:{server.server_address[1]}", base64.b64encode(ca.pem).decode(), server)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def closed_port() -> int:
    """A loopback port nothing listens on (a webhook that cannot be reached)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def webhook(name: str, url: str, ca_bundle: str, policy: str, modes: list[str], namespace: str = "") -> Json:
    """One pod-CREATE webhook of a configuration, for pods whose ``mode`` label is in ``modes``."""
    hook: Json = {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": policy,
        "timeoutSeconds": 5,
        "clientConfig": {"url": url, "caBundle": ca_bundle},
        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
        "objectSelector": {"matchExpressions": [{"key": "mode", "operator": "In", "values": modes}]},
    }
    if namespace:  # every namespace carries its name as this label
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    return hook
