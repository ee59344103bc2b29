"""The ``hami-extender`` process edge: flags, and serving HTTPS with the given certificate until stopped."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from pathlib import Path

import httpx
import pytest

from hami_extender.main import main, serve
from hami_extender.settings import ExtenderSettings
from hami_sim.tls import write_serving_certificate
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
