"""A free port can be taken by another process between the moment it is picked and etcd's or kube-apiserver's
bind (seen once in CI: etcd exited with "bind: address already in use" and `hami up` failed). The control
plane then starts on new ports."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hami_sim.realk8s import ControlPlane, K8sBinaries


def _port_of(argv: list[str], flag: str) -> int:
    value = next(a.split("=", 1)[1] for a in argv if a.startswith(f"{flag}="))
    return int(value.rsplit(":", 1)[1])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("flag", ["--listen-peer-urls", "--listen-client-urls"])
def test_etcd_whose_port_was_taken_meanwhile_starts_on_new_ports(k8s: K8sBinaries, tmp_path: Path, flag: str) -> None:
    plane = ControlPlane(binaries=k8s, workdir=tmp_path / "plane")
    taken = _port_of(plane.etcd.argv, flag)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with plane:
            assert _port_of(plane.etcd.argv, flag) != taken
            assert plane.request("GET", "/api/v1/namespaces/default")["metadata"]["name"] == "default"
