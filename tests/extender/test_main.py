"""The ``hami-extender`` process edge: flags, and serving HTTPS with the given certificate until stopped."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from hami_extender.main import main, serve
from hami_extender.settings import ExtenderSettings
from hami_sim.waiting import eventually
from tests.extender.conftest import free_port


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


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
    cert, key = self_signed(tmp_path)
    port = free_port()
    tls = dataclasses.replace(settings, http_port=port, tls_cert_file=str(cert), tls_key_file=str(key))
    stop = asyncio.Event()
    serving = asyncio.create_task(serve(tls, stop))
    async with httpx.AsyncClient(
        base_url=f"https://127.0.0.1:{port}", verify=ssl.create_default_context(cafile=str(cert))
    ) as client:

        async def healthy() -> bool:
            try:
                return (await client.get("/healthz")).status_code == 200
            except httpx.TransportError:
                return False

        await eventually(healthy)
    stop.set()
    await asyncio.wait_for(serving, 10)
