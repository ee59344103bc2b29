"""Every ``HAMI_*`` variable the manifests set is a setting of the service that reads it, and the
service's own settings loader accepts the values, exactly as it will at start-up in the cluster."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Final

import pytest

from hami_common.settings import ENV_PREFIX, env_name, load
from tests.deploy.manifests import ContainerRef, Rendering, env_of

# console script -> (module, settings class), as each service's main() passes it to service.run
SETTINGS: Final = {
    "hami-webhook": ("hami_webhook.settings", "WebhookSettings"),
    "hami-extender": ("hami_extender.settings", "ExtenderSettings"),
    "hami-allocator": ("hami_allocator.settings", "AllocatorSettings"),
    "hami-nodeagent": ("hami_nodeagent.settings", "NodeAgentSettings"),
    "hami-metrics": ("hami_metrics.settings", "MetricsSettings"),
}
FROM_REFERENCE: Final = "from-a-reference"  # what a secretKeyRef or fieldRef resolves to, for the loader


def service_containers(rendering: Rendering) -> list[tuple[ContainerRef, str]]:
    return [
        (ref, ref.container["command"][0])
        for ref in rendering.containers()
        if ref.container.get("command") and ref.container["command"][0] in SETTINGS
    ]


def settings_class(command: str) -> type:
    module_name, class_name = SETTINGS[command]
    module = pytest.importorskip(module_name, reason=f"{command} is not in this checkout yet")
    cls: type = getattr(importlib.import_module(module.__name__), class_name)
    return cls


def test_every_service_runs_somewhere(overlay: Rendering) -> None:
    assert {command for _, command in service_containers(overlay)} == set(SETTINGS)


def test_every_hami_variable_is_a_setting_of_its_service(overlay: Rendering) -> None:
    unknown = []
    for ref, command in service_containers(overlay):
        known = {env_name(f.name) for f in dataclasses.fields(settings_class(command))}
        unknown += [f"{ref.where}: {n}" for n in env_of(ref.container) if n.startswith(ENV_PREFIX) and n not in known]
    assert unknown == []


def test_each_service_accepts_its_configuration(overlay: Rendering) -> None:
    for ref, command in service_containers(overlay):
        env = {
            name: str(entry.get("value", FROM_REFERENCE))
            for name, entry in env_of(ref.container).items()
            if name.startswith(ENV_PREFIX)
        }
        settings: object = load(settings_class(command), [], env=env)
        assert settings is not None, ref.where
