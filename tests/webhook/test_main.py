"""The ``hami-webhook`` command: starts, serves HTTPS, stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import socket
import ssl
import subprocess
import sys

import httpx

from hami_common.resources import GPU
from hami_sim.waiting import eventually_sync
from tests.webhook.conftest import TlsFiles
from tests.webhook.support import container, pod, response_of, review


def test_the_command_serves_admissions_and_stops_on_sigterm(tls_files: TlsFiles) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable, "-c", "import sys; from hami_webhook.main import main; sys.exit(main(sys.argv[1:]))",
        "--host", "127.0.0.1", "--port", str(port), "--tls-cert-file", str(tls_files.cert),
        "--tls-key-file", str(tls_files.key), "--no-watch-cluster", "--no-publish-events",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    try:
        with httpx.Client(verify=ssl.create_default_context(cafile=str(tls_files.cert))) as http:

            def up() -> bool:
                assert process.poll() is None, process.communicate()[0].decode()
                try:
                    return http.get(url + "/readyz").status_code == 200
                except httpx.TransportError:
                    return False

            eventually_sync(up, what="hami-webhook listening")
            answer = http.post(url + "/webhook?timeout=10s", json=review(pod(container(limits={GPU: "1"}))))
        assert response_of(answer.content)["allowed"] is True
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=30)[0].decode()
    assert process.returncode == 0, output
