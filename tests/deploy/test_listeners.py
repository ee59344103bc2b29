"""Who can reach each socket the extender and the auth callout listen on, as deployed (issue 28 item 4).

A listener a network neighbour can reach must hold against a flood of connections that never finish their
TLS handshake or their request (the webhook's guard, :mod:`hami_common.connections`). The extender's API
(mutual TLS) listens on its pod's loopback, which only kube-scheduler shares: the pod has no host network,
the port is declared nowhere and no Service leads to it, so no neighbour reaches it and it is not guarded.
Its probe port, on the pod's address for the kubelet, is the one the guard serves
(tests/extender/test_probe_connections.py). ``hami-natsauth`` listens on nothing: it has no listener setting
and declares no port here, and tests/natsauth/test_listeners.py reads its sockets at run time.
Checked in every overlay, alone and with every component.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from hami_common.settings import env_name
from hami_extender.settings import ExtenderSettings
from hami_natsauth.settings import NatsAuthSettings
from tests.deploy.manifests import DEPLOY, OVERLAYS, ContainerRef, Rendering, env_of, render_with_component

COMPONENTS: Final = tuple(sorted(p.name for p in (DEPLOY / "kustomize" / "components").iterdir() if p.is_dir()))
# the only containers that share each pod's loopback: trusted peers of the loopback listener
POD_PEERS: Final = {"hami-scheduler": {"kube-scheduler", "extender"}, "hami-nats": {"nats", "natsauth"}}


@pytest.fixture(scope="module")
def with_components(deploy_tree: Path, kubectl: str) -> dict[str, Rendering]:
    return {
        f"{overlay}+{component}": render_with_component(deploy_tree, kubectl, overlay, component)
        for overlay in OVERLAYS
        for component in COMPONENTS
    }


def every_rendering(renderings: dict[str, Rendering], with_components: dict[str, Rendering]) -> Iterator[Rendering]:
    yield from (renderings[name] for name in OVERLAYS)
    yield from with_components.values()


def running(rendering: Rendering, command: str) -> list[ContainerRef]:
    found = [ref for ref in rendering.containers() if (ref.container.get("command") or [""])[0] == command]
    assert found, f"{rendering.name}: no container runs {command}"
    return found


def setting_value(ref: ContainerRef, name: str, default: object) -> str:
    entry = env_of(ref.container).get(env_name(name))
    if entry is None:
        return str(default)
    assert "value" in entry, f"{ref.where}: {env_name(name)} comes from a reference"
    return str(entry["value"])


def service_target_ports(rendering: Rendering) -> set[str]:
    return {str(p.get("targetPort", p["port"])) for s in rendering.of_kind("Service") for p in s["spec"]["ports"]}


def test_the_extender_api_listens_only_where_kube_scheduler_alone_reaches_it(
    renderings: dict[str, Rendering], with_components: dict[str, Rendering]
) -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(ExtenderSettings)}
    for rendering in every_rendering(renderings, with_components):
        for ref in running(rendering, "hami-extender"):
            where = f"{rendering.name}: {ref.where}"
            host = setting_value(ref, "http_host", defaults["http_host"])
            port = setting_value(ref, "http_port", defaults["http_port"])
            assert ipaddress.ip_address(host).is_loopback, f"{where}: the API listens on {host}"
            assert not ref.pod_spec.get("hostNetwork"), f"{where}: the pod's loopback would be the node's"
            peers = {c["name"] for c in ref.pod_spec["containers"]} | {
                c["name"] for c in ref.pod_spec.get("initContainers") or []
            }
            assert peers == POD_PEERS[ref.workload["metadata"]["name"]], f"{where}: shares its loopback with {peers}"
            declared = {(p.get("name"), str(p["containerPort"])) for p in ref.container.get("ports") or []}
            assert port not in {number for _, number in declared}, f"{where}: the API port is declared"
            assert port not in service_target_ports(rendering), f"{where}: a Service leads to the API port"
            # the one port a neighbour reaches: the probe port, served under the connection guard
            health = setting_value(ref, "health_port", defaults["health_port"])
            assert {number for _, number in declared} <= {health}, f"{where}: declares {declared}"


def test_the_auth_callout_listens_on_nothing(
    renderings: dict[str, Rendering], with_components: dict[str, Rendering]
) -> None:
    listener_settings = [
        f.name for f in dataclasses.fields(NatsAuthSettings) if f.name.endswith(("_port", "_host", "_addr", "_listen"))
    ]
    assert listener_settings == []  # nothing to configure: it only dials nats-server and the apiserver
    for rendering in every_rendering(renderings, with_components):
        for ref in running(rendering, "hami-natsauth"):
            where = f"{rendering.name}: {ref.where}"
            assert not ref.container.get("ports"), f"{where}: declares a port"
            assert not ref.pod_spec.get("hostNetwork"), where
            assert {c["name"] for c in ref.pod_spec["containers"]} == POD_PEERS["hami-nats"], where
