"""The process and its edges: the console script, configuration errors, TLS, the token file."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import sys
from pathlib import Path

import httpx
import pytest

from hami_common import subjects
from hami_common.bus import Bus, EmbeddedNats
from hami_common.errors import InvalidInput
from hami_metrics.main import main
from hami_metrics.settings import MetricsSettings
from hami_sim.tls import write_serving_certificate
from hami_sim.waiting import eventually

from .conftest import NODE, FakeClock, inventory, parse, series, serve

SCRIPT = Path(sys.executable).with_name("hami-metrics")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_help_lists_the_flags_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "--legacy-metrics" in out
    assert "HAMI_METRICS_TOKEN" in out


@pytest.mark.parametrize(
    "flags",
    [
        pytest.param(["--shard-index", "2", "--shard-count", "2"], id="a shard index outside the count"),
        pytest.param(["--tls-cert-file", "cert.pem"], id="a certificate without its key"),
        pytest.param(["--node-staleness-s", "0"], id="a staleness of zero"),
    ],
)
def test_inconsistent_settings_exit_2_before_serving(flags: list[str]) -> None:
    assert main(flags) == 2


def test_an_unreadable_token_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="metrics-token-file"):
        MetricsSettings(metrics_token_file=str(tmp_path / "absent")).token()


async def test_the_console_script_serves_until_sigterm(nats_server: EmbeddedNats, bus: Bus, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "HAMI_NATS_URL": nats_server.url, "OTEL_SDK_DISABLED": "true"}
    with (tmp_path / "hami-metrics.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            str(SCRIPT), "--http-host", "127.0.0.1", "--http-port", str(port), env=env, stdout=log, stderr=log
        )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:

            async def healthy() -> bool:
                try:
                    return (await client.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(healthy, timeout=30, what="the process answers /healthz")  # another process

            async def node_listed() -> bool:
                await bus.publish(subjects.inventory(NODE), inventory())
                text = (await client.get("/metrics")).text
                return bool(series(parse(text), "hami_gpu_memory_limit_bytes"))

            await eventually(node_listed, timeout=15, what="a published inventory shows in /metrics")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_tls_and_a_token_file_guard_metrics(
    tmp_path: Path, settings: MetricsSettings, bus: Bus, clock: FakeClock
) -> None:
    files = write_serving_certificate(tmp_path)
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    secured = MetricsSettings(
        nats_url=settings.nats_url,
        tls_cert_file=str(files.cert),
        tls_key_file=str(files.key),
        metrics_token_file=str(token_file),
    )
    trust = ssl.create_default_context(cafile=str(files.ca))
    async with serve(secured, bus, clock, scheme="https", verify=trust) as running:
        assert (await running.client.get("/metrics")).status_code == 401
        assert await running.scrape(Authorization="Bearer from-a-file")
