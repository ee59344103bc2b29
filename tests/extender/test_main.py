"""The ``hami-extender`` process edge: flags, and serving HTTPS with the given certificate until stopped."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from pathlib import Path

import httpx
import pytest

from hami_common.errors import InvalidInput
from hami_extender.main import main, serve
from hami_extender.settings import ExtenderSettings
from hami_sim.tls import CertificateAuthority, TlsFiles, write_serving_certificate
from hami_sim.waiting import eventually
from tests.extender.conftest import free_port


def test_help_lists_the_extender_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--gpu-scheduler-policy" in out
    assert "--leader-elect" in out


async def test_serves_https_with_the_given_certificate_until_stopped(
    settings: ExtenderSettings, tmp_path: Path
) -> None:
    files = write_serving_certificate(tmp_path)
    port = free_port()
    tls = dataclasses.replace(settings, http_port=port, tls_cert_file=str(files.cert), tls_key_file=str(files.key))
    stop = asyncio.Event()
    serving = asyncio.create_task(serve(tls, stop))
    async with httpx.AsyncClient(
        base_url=f"https://127.0.0.1:{port}", verify=ssl.create_default_context(cafile=str(files.ca))
    ) as client:

        async def healthy() -> bool:
            try:
                return (await client.get("/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(healthy)
    stop.set()
    await asyncio.wait_for(serving, 10)


async def test_with_a_client_ca_only_clients_with_its_certificates_get_past_the_handshake(
    settings: ExtenderSettings, tmp_path: Path
) -> None:
    """HAMi#3030: with server-only TLS anyone who reached the port could bind any pod."""
    ca = CertificateAuthority(tmp_path / "ca")
    server = ca.serving("tls", ("127.0.0.1",))
    scheduler = ca.client("kube-scheduler", "hami-scheduler")
    stranger = CertificateAuthority(tmp_path / "other", name="another CA").client("stranger", "hami-scheduler")
    port, probe_port = free_port(), free_port()
    mtls = dataclasses.replace(
        settings,
        http_port=port,
        tls_cert_file=str(server.cert),
        tls_key_file=str(server.key),
        tls_client_ca_file=str(ca.cert_file),
        health_port=probe_port,
    )
    stop = asyncio.Event()
    serving = asyncio.create_task(serve(mtls, stop))
    url = f"https://127.0.0.1:{port}"

    def context(client: TlsFiles | None) -> ssl.SSLContext:
        made = ssl.create_default_context(cafile=str(server.ca))
        if client is not None:
            made.load_cert_chain(str(client.cert), str(client.key))
        return made

    try:
        async with (
            httpx.AsyncClient(base_url=url, verify=context(scheduler)) as trusted,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{probe_port}") as kubelet,
        ):

            async def healthy() -> bool:
                try:
                    return (await trusted.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(healthy)
            for client in (None, stranger):
                async with httpx.AsyncClient(base_url=url, verify=context(client)) as refused:
                    with pytest.raises(httpx.TransportError):
                        await refused.post("/bind", json={"PodName": "p", "PodNamespace": "default", "Node": "n"})
            # the kubelet's probes, which carry no certificate, reach /healthz on their own port and nothing else
            assert (await kubelet.get("/healthz")).status_code == 200
            assert (await kubelet.post("/bind", json={})).status_code == 404
    finally:
        stop.set()
        await asyncio.wait_for(serving, 10)


async def test_a_client_ca_without_a_serving_certificate_is_a_clear_error(settings: ExtenderSettings) -> None:
    with pytest.raises(InvalidInput, match="needs --tls-cert-file"):
        await serve(dataclasses.replace(settings, tls_client_ca_file="/etc/ca.crt"), asyncio.Event())
