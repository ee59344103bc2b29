"""The production overlay survives losing any one replica: two scheduler pods (each extender follows its own
kube-scheduler's Lease and labels its pod with its role), and a three-server NATS cluster over mutual TLS
holding the placement stream three times. tests/common/test_bus_cluster.py runs such a cluster and kills a
server; tests/realk8s/test_failover.py kills the leading scheduler pod."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from hami_common.bus import find_nats_server
from tests.deploy.manifests import Rendering, env_of
from tests.deploy.natsconf import ISSUER_VARIABLE, nats_config_users


def test_two_scheduler_pods_label_their_role(renderings: dict[str, Rendering]) -> None:
    production = renderings["production"]
    scheduler = production.get("Deployment", "hami-scheduler")
    assert scheduler["spec"]["replicas"] >= 2
    env = env_of(production.container("hami-scheduler", "extender").container)
    assert env["HAMI_LEADER_FOLLOW"]["value"] == "true"
    assert env["HAMI_ROLE_LABEL"]["value"] == "true"
    assert env["HAMI_PLACEMENT_REPLICAS"]["value"] == "3"


def test_nats_is_three_servers_routed_to_each_other_over_mutual_tls(renderings: dict[str, Rendering]) -> None:
    production = renderings["production"]
    nats = production.get("StatefulSet", "hami-nats")
    replicas = nats["spec"]["replicas"]
    assert replicas == 3
    cluster = production.get("ConfigMap", "hami-nats")["data"]["cluster.conf"]
    routes = re.findall(r"nats-route://([\w.-]+):6222", cluster)
    headless = nats["spec"]["serviceName"]
    assert routes == [f"{nats['metadata']['name']}-{i}.{headless}" for i in range(replicas)]
    tls = cluster[cluster.index("tls {") :]
    assert "verify: true" in tls
    assert "ca_file" in tls
    ports = {p["name"]: p["port"] for p in production.get("Service", headless)["spec"]["ports"]}
    assert ports["cluster"] == 6222
    certificate = production.get("Certificate", "hami-nats")["spec"]
    assert "client auth" in certificate["usages"]
    assert f"*.{headless}" in certificate["dnsNames"]


def test_dev_stays_one_server_without_routes(renderings: dict[str, Rendering]) -> None:
    dev = renderings["dev"]
    assert dev.get("StatefulSet", "hami-nats")["spec"]["replicas"] == 1
    assert "cluster {" not in dev.get("ConfigMap", "hami-nats")["data"]["cluster.conf"]
    assert "include ./cluster.conf" in dev.get("ConfigMap", "hami-nats")["data"]["nats.conf"]


def test_nats_server_accepts_the_production_cluster_configuration(
    renderings: dict[str, Rendering], deploy_tree: Path, tmp_path: Path
) -> None:
    """``nats-server -t`` on the rendered files, the Secret's paths moved to the generated dev certificates."""
    data = renderings["production"].get("ConfigMap", "hami-nats")["data"]
    certs = deploy_tree / "kustomize" / "overlays" / "dev" / "secrets" / "tls"
    moved = {"/etc/nats-tls/tls.crt": certs / "nats.crt", "/etc/nats-tls/tls.key": certs / "nats.key"}
    moved["/etc/nats-tls/ca.crt"] = certs / "ca.crt"
    for name, text in data.items():
        for path, local in moved.items():
            text = text.replace(path, str(local))
        (tmp_path / name).write_text(text)
    issuer = (deploy_tree / "kustomize" / "overlays" / "dev" / "secrets" / "nats-issuer" / "issuer").read_text()
    env = {**os.environ, **dict.fromkeys(nats_config_users().values(), "secret"), ISSUER_VARIABLE: issuer}
    checked = subprocess.run(
        [find_nats_server(), "-t", "-c", str(tmp_path / "nats.conf")],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
