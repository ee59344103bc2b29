"""docker-compose.yml: valid against the Compose specification's JSON schema, and wired to the real
services (their commands, their settings, the files it mounts, the node and GPUs it declares)."""

from __future__ import annotations

import base64
import json
from importlib import resources as importlib_resources
from typing import Any, Final

import jsonschema
import kubernetes_validate
import msgspec
import pytest
import yaml

from hami_common.inventory import decode_fake_inventory
from hami_common.settings import ENV_PREFIX, load
from tests.deploy.manifests import DEPLOY, REPO_ROOT
from tests.deploy.test_components import SchedulerConfiguration
from tests.deploy.test_settings import SETTINGS, settings_class

COMPOSE_FILE: Final = REPO_ROOT / "docker-compose.yml"
COMPOSE_DIR: Final = REPO_ROOT / "deploy" / "compose"
MOUNTED_AT: Final = "/etc/hami/compose"  # where deploy/compose is mounted in the containers


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return loaded


def compose_schema() -> dict[str, Any]:
    """The compose-spec schema as the check-jsonschema package vendors it (works offline)."""
    try:
        vendored = importlib_resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / "compose-spec.json"
    except ModuleNotFoundError:
        pytest.skip("check-jsonschema (the compose-spec schema) is not installed: add it to the dev extras")
    schema: dict[str, Any] = json.loads(vendored.read_text())
    return schema


def hami_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if (svc.get("command") or [""])[0] in SETTINGS}


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []


def test_compose_runs_every_service_and_the_supporting_cast(compose: dict[str, Any]) -> None:
    commands = {svc["command"][0] for svc in hami_services(compose).values()}
    assert commands == set(SETTINGS)
    images = " ".join(svc.get("image", "") for svc in compose["services"].values())
    for needed in ("k3s", "nats", "jaeger", "prometheus"):
        assert needed in images


def test_each_service_accepts_its_compose_configuration(compose: dict[str, Any]) -> None:
    for name, svc in hami_services(compose).items():
        env = {k: str(v) for k, v in svc["environment"].items() if k.startswith(ENV_PREFIX)}
        settings: object = load(settings_class(svc["command"][0]), [], env=env)
        assert settings is not None, name


def test_every_file_the_stack_mounts_exists(compose: dict[str, Any]) -> None:
    for svc in compose["services"].values():
        for volume in svc.get("volumes") or []:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO_ROOT / source).exists(), source
        for value in [str(v) for v in (svc.get("environment") or {}).values()] + list(svc.get("command") or []):
            if value.startswith(MOUNTED_AT + "/"):
                assert (COMPOSE_DIR / value.removeprefix(MOUNTED_AT + "/")).is_file(), value


def test_declared_gpus_are_the_ones_the_device_plugin_advertises(compose: dict[str, Any]) -> None:
    services = compose["services"]
    node = next(a.split("=", 1)[1] for a in services["k3s"]["command"] if a.startswith("--node-name="))
    assert services["nodeagent"]["environment"]["HAMI_NODE_NAME"] == node
    assert services["allocator"]["environment"]["HAMI_NODE_NAME"] == node
    gpus, _ = decode_fake_inventory((COMPOSE_DIR / "fake-inventory.yaml").read_text(), node)
    assert gpus
    for name in ("nodeagent", "allocator"):
        env = services[name]["environment"]
        assert env["HAMI_INVENTORY"] == "fake"
        assert env["HAMI_FAKE_INVENTORY"] == f"{MOUNTED_AT}/fake-inventory.yaml", "both read the same GPUs"


def test_k3s_scheduler_reaches_the_compose_extender(compose: dict[str, Any]) -> None:
    raw = yaml.safe_load((COMPOSE_DIR / "kube-scheduler.yaml").read_text())
    assert raw.pop("clientConnection")["kubeconfig"].startswith("/var/lib/rancher/k3s/")
    config = msgspec.convert(raw, SchedulerConfiguration)
    (extender,) = config.extenders
    env = compose["services"]["extender"]["environment"]
    assert extender.urlPrefix == f"https://{env['HAMI_HTTP_HOST']}:{env['HAMI_HTTP_PORT']}"
    assert extender.nodeCacheCapable
    assert (extender.filterVerb, extender.bindVerb) == ("filter", "bind")
    assert "hami-scheduler" in [p.schedulerName for p in config.profiles]
    assert extender.tlsConfig is not None
    assert extender.tlsConfig.caFile.startswith("/etc/hami/certs/")


def test_compose_webhook_registration_is_valid_kubernetes(compose: dict[str, Any]) -> None:
    text = (COMPOSE_DIR / "webhook.yaml").read_text().replace("CA_BUNDLE", base64.b64encode(b"ca").decode())
    registration = yaml.safe_load(text)
    kubernetes_validate.validate(registration, kubernetes_validate.latest_version(), strict=True)
    (hook,) = registration["webhooks"]
    env = compose["services"]["webhook"]["environment"]
    assert hook["clientConfig"]["url"] == f"https://{env['HAMI_HOST']}:{env['HAMI_PORT']}/webhook"
    assert "kube-system" in hook["namespaceSelector"]["matchExpressions"][0]["values"]


def test_sample_pod_is_valid_and_asks_for_a_gpu_slice() -> None:
    pod = yaml.safe_load((COMPOSE_DIR / "sample-pod.yaml").read_text())
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    assert any(k.startswith("nvidia.com/") for k in pod["spec"]["containers"][0]["resources"]["limits"])


def test_k3s_scheduler_manages_the_same_resources_as_the_cluster_scheduler(compose: dict[str, Any]) -> None:
    cluster = yaml.safe_load((DEPLOY / "kustomize" / "base" / "scheduler" / "kube-scheduler.yaml").read_text())
    local = yaml.safe_load((COMPOSE_DIR / "kube-scheduler.yaml").read_text())
    (cluster_extender,) = cluster["extenders"]
    (local_extender,) = local["extenders"]
    for key in ("managedResources", "filterVerb", "bindVerb", "preemptVerb", "nodeCacheCapable", "httpTimeout"):
        assert local_extender[key] == cluster_extender[key], key


# Compose v1 (docker-compose 1.29, Debian's) accepts these top-level keys and extension fields only; it
# refuses "name", which v2 allows. Both read COMPOSE_PROJECT_NAME from .env beside the file.
COMPOSE_V1_TOP_LEVEL: Final = frozenset({"version", "services", "networks", "volumes", "secrets", "configs"})


def test_compose_file_is_also_valid_for_compose_v1_and_names_the_project_in_env(compose: dict[str, Any]) -> None:
    unknown = {key for key in compose if key not in COMPOSE_V1_TOP_LEVEL and not key.startswith("x-")}
    assert unknown == set(), f"Compose v1 refuses top-level {sorted(unknown)}"
    env = dict(
        line.split("=", 1)
        for line in (REPO_ROOT / ".env").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert env["COMPOSE_PROJECT_NAME"] == "hami"
