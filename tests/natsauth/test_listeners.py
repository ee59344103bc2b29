"""``hami-natsauth`` listens on nothing (issue 28 item 4): it only dials out, to nats-server and the apiserver.

So a network neighbour has no socket of it to flood with half-open connections, and it needs no connection
guard. The process is started as the StatefulSet starts it (its console script, settings from ``HAMI_*``),
and once it serves the callout subject its sockets are read from ``/proc``: not one listens (TCP, UDP or
unix). The manifests' side (no port declared, no listener setting) is tests/deploy/test_listeners.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import nats
import nkeys
import pytest

from hami_common import subjects
from hami_common.bus import EmbeddedNats
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.waiting import eventually

START_S: Final = 60.0  # a cold interpreter on a busy machine; nothing waits this long when all is well
_TCP_LISTEN: Final = "0A"  # /proc/net/tcp's state column
_UNIX_ACCEPTING: Final = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's flags column


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue  # closed while we looked
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def listening_sockets(pid: int) -> list[str]:
    """The process's sockets that wait for peers: TCP in LISTEN, any bound UDP socket, accepting unix ones."""
    mine = socket_inodes(pid)
    found = []
    net = Path(f"/proc/{pid}/net")
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in (net / table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if inode in mine and (table.startswith("udp") or state == _TCP_LISTEN):
                found.append(f"{table} {local}")
    for line in (net / "unix").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[6] in mine and int(fields[3], 16) & _UNIX_ACCEPTING:
            found.append(f"unix {fields[7] if len(fields) > 7 else '(unnamed)'}")
    return found


@pytest.fixture
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator() as api:
        yield api


@pytest.fixture
def natsauth(tmp_path: Path, nats_server: EmbeddedNats, emulator: KubeApiEmulator) -> Iterator[subprocess.Popen[bytes]]:
    seed = tmp_path / "seed"
    seed.write_bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT))
    env = {
        **os.environ,
        "HAMI_SERVICE_NAME": "hami-natsauth",
        "HAMI_NATS_URL": nats_server.url,
        "HAMI_ISSUER_SEED_FILE": str(seed),
        "HAMI_KUBECONFIG": str(emulator.write_kubeconfig(tmp_path / "kubeconfig")),
    }
    script = Path(sysconfig.get_path("scripts")) / "hami-natsauth"
    log = tmp_path / "natsauth.log"
    with log.open("wb") as out:
        process = subprocess.Popen([str(script)], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        print(log.read_text())  # shown by pytest when the test failed


async def test_natsauth_opens_no_listening_socket(natsauth: subprocess.Popen[bytes], nats_server: EmbeddedNats) -> None:
    nc = await nats.connect(nats_server.url)
    try:

        async def serving() -> bool:
            assert natsauth.poll() is None, "hami-natsauth exited"
            try:
                await nc.request(subjects.AUTH_CALLOUT, b"not a request JWT", timeout=0.5)
            except nats.errors.NoRespondersError:
                return False  # not subscribed yet
            except nats.errors.TimeoutError:
                return True  # subscribed: it ignores a malformed request
            return True

        await eventually(serving, timeout=START_S, what="hami-natsauth serving the callout subject")
    finally:
        await nc.close()
    assert socket_inodes(natsauth.pid), "no socket at all: not the process that dials nats-server"
    assert listening_sockets(natsauth.pid) == []
