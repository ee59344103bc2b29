"""The deployed NATS configuration (base/nats/nats.conf) and a real nats-server running it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hami_common.bus import find_nats_server
from tests.deploy.manifests import DEPLOY

__all__ = ["ISSUER_VARIABLE", "NATS_CONF", "NatsSecrets", "nats_config_users", "running_nats"]

NATS_CONF: Final = DEPLOY / "kustomize" / "base" / "nats" / "nats.conf"
_READY_S: Final = 30.0
ISSUER_VARIABLE: Final = "NATS_CALLOUT_ISSUER"  # nats.conf: auth_callout.issuer


def nats_config_users() -> dict[str, str]:
    """user -> the environment variable its password comes from, as nats.conf declares them."""
    return dict(re.findall(r"user:\s*(\w+)\s*,?\s*password:\s*\$(\w+)", NATS_CONF.read_text()))


@dataclass(frozen=True, slots=True)
class NatsSecrets:
    """What the StatefulSet's Secrets give nats-server: the passwords, the callout's issuer, the TLS pair."""

    passwords: Mapping[str, str]
    issuer: str
    cert: Path
    key: Path


@contextmanager
def running_nats(workdir: Path, secrets: NatsSecrets, args: list[str]) -> Iterator[str]:
    """nats-server with the deployed config, the StatefulSet's ``args`` (ports, store and certificate files
    moved into ``workdir`` and ``secrets``) and the Secrets' values in its environment; yields the client URL."""
    moved = ("--config=", "--port=", "--http_port=", "--store_dir=", "--name=", "--tlscert=", "--tlskey=")
    kept = [a for a in args if not a.startswith(moved)]
    if "--tls" in kept:
        kept += ["--tlscert", str(secrets.cert), "--tlskey", str(secrets.key)]
    env = {**os.environ, **{variable: secrets.passwords[user] for user, variable in nats_config_users().items()}}
    env[ISSUER_VARIABLE] = secrets.issuer
    ports_dir = workdir / "ports"
    ports_dir.mkdir(parents=True)
    command = [find_nats_server(), "--config", str(NATS_CONF), *kept, "--addr", "127.0.0.1", "--port", "-1"]
    command += ["--store_dir", str(workdir / "js"), "--ports_file_dir", str(ports_dir)]
    log = workdir / "nats.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield _await_url(proc, ports_dir, log)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _await_url(proc: subprocess.Popen[bytes], ports_dir: Path, log: Path) -> str:
    deadline = time.monotonic() + _READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"nats-server rejected the deployed config:\n{log.read_text()}")
        for ports_file in ports_dir.glob("*.ports"):
            try:
                return str(json.loads(ports_file.read_text())["nats"][0])
            except (ValueError, KeyError):
                continue  # written but not complete yet
        time.sleep(0.01)  # a child process offers no event to await
    raise AssertionError("nats-server did not report its port")
