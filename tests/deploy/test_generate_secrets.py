"""deploy/generate-secrets.sh: the self-signed certificate and password generator for clusters without
cert-manager. Its certificates are checked the way their clients use them: a real TLS handshake that
verifies the chain and the name the apiserver (service DNS name) or kube-scheduler (127.0.0.1) dials."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import stat
import subprocess
from pathlib import Path
from typing import Final

import pytest
from cryptography import x509

from tests.deploy.manifests import DEPLOY

SCRIPT: Final = DEPLOY / "generate-secrets.sh"
pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed (the script needs it)")
USERS: Final = ("extender", "webhook", "metrics", "natsauth")


def generate(target: Path, *args: str) -> None:
    subprocess.run(["sh", str(SCRIPT), *args, str(target)], check=True, timeout=60, capture_output=True)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("overlay")
    generate(target, "--tls")
    return target / "secrets"


def contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def handshake(cert: Path, key: Path, ca: Path, host: str, server_name: str) -> str:
    """Serve TLS with ``cert`` on ``host``; connect verifying against ``ca`` as ``server_name``; the
    peer certificate's subject as the client saw it."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.create_default_context(cafile=str(ca))
    client_ctx.verify_flags |= ssl.VERIFY_X509_STRICT  # as strict as Go's verifier, and Python >= 3.13's default

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(on_client, host, 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    async with server, asyncio.timeout(10):
        _, writer = await asyncio.open_connection(host, port, ssl=client_ctx, server_hostname=server_name)
        peer = writer.get_extra_info("peercert")
        writer.close()
    return str(peer["subject"])


def test_every_nats_user_gets_a_distinct_password_without_a_newline(generated: Path) -> None:
    passwords = [(generated / "nats" / user).read_text() for user in USERS]
    assert len(set(passwords)) == len(USERS)
    assert all(len(p) >= 32 and p.strip() == p for p in passwords)


def test_files_are_readable_by_their_owner_only(generated: Path) -> None:
    for path in generated.rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path.name


async def test_apiserver_can_verify_the_webhook_by_its_service_name(generated: Path) -> None:
    tls = generated / "tls"
    subject = await handshake(
        tls / "webhook.crt", tls / "webhook.key", tls / "ca.crt", "127.0.0.1", "hami-webhook.hami-system.svc"
    )
    assert "hami-webhook.hami-system.svc" in subject


async def test_kube_scheduler_can_verify_the_extender_on_loopback(generated: Path) -> None:
    tls = generated / "tls"
    await handshake(tls / "extender.crt", tls / "extender.key", tls / "ca.crt", "127.0.0.1", "127.0.0.1")


async def test_a_certificate_is_refused_for_a_name_it_does_not_carry(generated: Path) -> None:
    tls = generated / "tls"
    with pytest.raises(ssl.SSLCertVerificationError):
        await handshake(tls / "webhook.crt", tls / "webhook.key", tls / "ca.crt", "127.0.0.1", "evil.example")


def test_serving_certificates_are_for_servers_only(generated: Path) -> None:
    for name in ("webhook", "extender"):
        cert = x509.load_pem_x509_certificate((generated / "tls" / f"{name}.crt").read_bytes())
        assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert list(usages) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]


def test_running_again_changes_nothing_and_force_renews(tmp_path: Path) -> None:
    generate(tmp_path, "--tls")
    first = contents(tmp_path / "secrets")
    generate(tmp_path, "--tls")
    assert contents(tmp_path / "secrets") == first
    generate(tmp_path, "--tls", "--force")
    renewed = contents(tmp_path / "secrets")
    assert set(renewed) == set(first)
    assert all(renewed[name] != first[name] for name in first)


def test_other_namespaces_get_certificates_for_their_service_name(tmp_path: Path) -> None:
    generate(tmp_path, "--tls", "--namespace", "gpu-infra")
    cert = x509.load_pem_x509_certificate((tmp_path / "secrets" / "tls" / "webhook.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "hami-webhook.gpu-infra.svc" in names.get_values_for_type(x509.DNSName)


def test_a_bad_invocation_exits_2_with_usage(tmp_path: Path) -> None:
    proc = subprocess.run(["sh", str(SCRIPT), "--bogus", str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "unknown option" in proc.stderr


async def test_the_extender_admits_kube_schedulers_client_certificate_only(generated: Path) -> None:
    """The extender requires mutual TLS (HAMi#3030): kube-scheduler's certificate gets through, no
    certificate does not."""
    tls = generated / "tls"
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls / "ca.crt"))
    server_ctx.load_cert_chain(tls / "extender.crt", tls / "extender.key")
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server_ctx.verify_flags |= ssl.VERIFY_X509_STRICT

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    async def answer(client_ctx: ssl.SSLContext) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="127.0.0.1")
        try:
            return await reader.read(2)
        finally:
            writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    async with server, asyncio.timeout(10):
        scheduler = ssl.create_default_context(cafile=str(tls / "ca.crt"))
        scheduler.load_cert_chain(tls / "scheduler-client.crt", tls / "scheduler-client.key")
        assert await answer(scheduler) == b"ok"
        try:  # TLS 1.3: the client learns of the refusal on its first read, as an alert or the end of the stream
            refused = await answer(ssl.create_default_context(cafile=str(tls / "ca.crt")))
        except (ssl.SSLError, ConnectionError):
            refused = b""
        assert refused == b""
    cert = x509.load_pem_x509_certificate((tls / "scheduler-client.crt").read_bytes())
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]


def copy_overlays(tmp_path: Path) -> Path:
    """The overlays and the base they build on, copied so the script can write beside them."""
    root = tmp_path / "deploy"
    shutil.copytree(DEPLOY / "kustomize", root / "kustomize", ignore=shutil.ignore_patterns("secrets"))
    return root / "kustomize" / "overlays"


def test_it_says_what_it_wrote_and_where_then_what_it_kept(tmp_path: Path) -> None:
    overlay = copy_overlays(tmp_path) / "production"
    first = subprocess.run(["sh", str(SCRIPT), str(overlay)], capture_output=True, text=True, timeout=60, check=True)
    assert f"wrote to {overlay}/secrets/:" in first.stdout
    listed = {line.strip() for line in first.stdout.splitlines() if line.startswith("  ")}
    assert listed == set(contents(overlay / "secrets"))
    assert {"grant-key", "metrics/token", "nats-issuer/seed", "nats/extender"} <= listed
    again = subprocess.run(["sh", str(SCRIPT), str(overlay)], capture_output=True, text=True, timeout=60, check=True)
    assert "wrote to" not in again.stdout
    assert "kept (already there; --force makes new ones):" in again.stdout


def test_an_overlay_that_takes_no_secrets_is_refused_and_pointed_at_the_one_it_uses(tmp_path: Path) -> None:
    """otel renders dev's Secrets: keys written into otel/ would be read by nothing (and were once a
    CA key in a folder git did not ignore)."""
    otel = copy_overlays(tmp_path) / "otel"
    proc = subprocess.run(["sh", str(SCRIPT), "--tls", str(otel)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "takes no secrets" in proc.stderr
    assert "overlays/dev instead" in proc.stderr
    assert not (otel / "secrets").exists()


def test_an_overlay_reading_tls_files_asks_for_tls(tmp_path: Path) -> None:
    dev = copy_overlays(tmp_path) / "dev"
    proc = subprocess.run(["sh", str(SCRIPT), str(dev)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "run again with --tls" in proc.stderr


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_git_ignores_every_overlays_secrets() -> None:
    overlays = sorted(p for p in (DEPLOY / "kustomize" / "overlays").iterdir() if p.is_dir())
    assert overlays
    for overlay in overlays:
        probe = overlay / "secrets" / "tls" / "ca.key"
        proc = subprocess.run(["git", "check-ignore", "-q", str(probe)], cwd=DEPLOY, timeout=30, check=False)
        assert proc.returncode in (0, 128), f"git does not ignore {probe}"  # 128: not a git checkout
        if proc.returncode == 128:
            pytest.skip("not a git checkout")
