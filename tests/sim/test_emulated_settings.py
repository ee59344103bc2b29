"""The emulated stack's in-process services are set as deploy/ sets their containers.

A setting is written once, in deploy/: the emulated stack takes every ``HAMI_*`` value of the container as
written, maps only what names a place of the cluster, and leaves out only what the table EMULATED_AWAY
names (each with its reason, shown in docs/kube-emulator.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hami_common.bus import EmbeddedNats
from hami_common.settings import ENV_PREFIX, load
from hami_metrics.settings import MetricsSettings
from hami_sim.deployed import EMULATED_AWAY, _settings, deployed_env, deployed_settings
from hami_sim.realk8s import deployed
from hami_sim.stack import StackConfig
from hami_sim.stack._cluster import LocalCluster
from hami_sim.stack._node import NodeConnections, SimNode

Json = dict[str, Any]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "kube-emulator.md"


@pytest.fixture(autouse=True)
def _fresh_rendering() -> Iterator[None]:
    _settings._container.cache_clear()
    yield
    _settings._container.cache_clear()


def _edit(monkeypatch: pytest.MonkeyPatch, workload: str, container: str, change: Callable[[list[Json]], None]) -> None:
    """deploy/ as rendered, with one container's env changed (as a change to the manifest would)."""
    docs = deployed()
    for doc in docs:
        if doc["metadata"]["name"] == workload and doc.get("kind") in ("Deployment", "DaemonSet"):
            for ctr in doc["spec"]["template"]["spec"]["containers"]:
                if ctr["name"] == container:
                    change(ctr["env"])
    monkeypatch.setattr(_settings, "deployed", lambda: docs)


@contextlib.asynccontextmanager
async def _services(tmp_path: Path) -> AsyncIterator[tuple[LocalCluster, SimNode]]:
    """The emulated stack's cluster services and one node, not started (their NATS is: it has the URL)."""
    config = StackConfig(workdir=tmp_path, sockdir=tmp_path)
    cluster = LocalCluster(config)
    assert isinstance(cluster.nats, EmbeddedNats)  # the emulated stack's one plain server
    try:
        with cluster.nats:
            async with asyncio.TaskGroup() as tasks:
                connections = NodeConnections(cluster.nats.url, str(config.kubeconfig))
                yield cluster, SimNode("gpu-node-0", config, connections, tasks, lambda _: None)
    finally:
        for port in (cluster._metrics_port, cluster._webhook_port, cluster._extender_port):
            port.close()


def _taken(settings: object, workload: str, container: str, places: set[str]) -> dict[str, tuple[Any, Any]]:
    """Every literal HAMI_* value of the container that is not a place nor away: (deploy's, the service's)."""
    out: dict[str, tuple[Any, Any]] = {}
    for name, value in deployed_env(workload, container):
        field = name.removeprefix(ENV_PREFIX).lower()
        if value is None or name in EMULATED_AWAY or field in places:
            continue
        others = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.name != field}  # type: ignore[arg-type]
        expected = getattr(load(type(settings), [], env={name: value}, given=others), field)
        out[name] = (expected, getattr(settings, field))
    return out


async def test_every_literal_setting_of_a_deployed_container_reaches_its_emulated_service(tmp_path: Path) -> None:
    async with _services(tmp_path) as (cluster, node):
        services = (
            (cluster.extender_settings(), "hami-scheduler", "extender"),
            (cluster.metrics_settings(), "hami-metrics", "metrics"),
            (node.agent_settings(), "hami-node", "nodeagent"),
            (node.allocator_settings(), "hami-node", "allocator"),
        )
    for settings, workload, container in services:
        # the places the stack maps: addresses, mounted files, host paths, the node's own inventory
        places = {
            "nats_url", "http_host", "http_port", "tls_cert_file", "tls_key_file", "grant_key_file",
            "plugin_dir", "pod_resources_socket", "staging_dir", "hook_path", "inventory",
        }  # fmt: skip
        taken = _taken(settings, workload, container, places)
        assert taken, (workload, container)
        assert {k: v for k, v in taken.items() if v[0] != v[1]} == {}, (workload, container)


async def test_a_value_changed_in_deploy_is_what_the_emulated_service_runs_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def rename(env: list[Json]) -> None:
        for var in env:
            if var["name"] == "HAMI_SCHEDULER_NAME":
                var["value"] = "team-scheduler"

    async with _services(tmp_path) as (cluster, _):
        assert cluster.extender_settings().scheduler_name == "hami-scheduler"
        _edit(monkeypatch, "hami-scheduler", "extender", rename)
        _settings._container.cache_clear()
        assert cluster.extender_settings().scheduler_name == "team-scheduler"


def test_a_secret_the_emulated_stack_does_not_know_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting added to deploy/ from a Secret is mapped or listed as away, never dropped in silence."""

    def add(env: list[Json]) -> None:
        env.append({"name": "HAMI_NEW_SETTING", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}})

    _edit(monkeypatch, "hami-metrics", "metrics", add)
    with pytest.raises(LookupError, match="HAMI_NEW_SETTING"):
        deployed_settings(MetricsSettings, "hami-metrics", "metrics", mapped={"nats_url": "nats://127.0.0.1:1"})


def test_mapped_fields_replace_what_deploy_spells_and_nothing_else() -> None:
    as_deployed = deployed_settings(MetricsSettings, "hami-metrics", "metrics", mapped={})
    settings = deployed_settings(MetricsSettings, "hami-metrics", "metrics", mapped={"http_port": 1234})
    assert settings == dataclasses.replace(as_deployed, http_port=1234)
    assert as_deployed.http_port == int(dict(deployed_env("hami-metrics", "metrics"))["HAMI_HTTP_PORT"] or 0)


def test_what_the_emulated_stack_leaves_out_is_in_the_docs() -> None:
    docs = DOCS.read_text()
    missing = [name for name in EMULATED_AWAY if f"`{name}`" not in docs]
    assert missing == []
