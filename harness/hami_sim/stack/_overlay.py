"""The local stack's choices as a kustomize overlay on deploy/'s dev overlay, as an operator would write one.

What ``StackConfig`` asks of the services (scheduling policies, the device config that enables other
vendors, the MIG nodes' node config, NATS servers and the copies of the placement stream) is not handed to
them as flags: it is this overlay's ConfigMap and patches, rendered by kubectl with the rest, so the pods run
what deploy/ says plus what an operator could have said. Everything else (ports, TLS, identities, tokens,
RBAC) comes from deploy/ unchanged.
"""

from __future__ import annotations

import json
from typing import Any, Final

import yaml

from hami_common.settings import env_name
from hami_sim.stack._config import StackConfig, node_config_document

__all__ = ["LOCAL_CONFIG_MOUNT", "LOCAL_OVERLAY", "local_overlay"]

LOCAL_OVERLAY: Final = "local"
LOCAL_CONFIG: Final = "hami-local-config"
LOCAL_CONFIG_MOUNT: Final = "/etc/hami/local-config"
_DEVICE_CONFIG: Final = "device-config.yaml"
_NODE_CONFIG: Final = "config.json"
_NATS_CLUSTER: Final = "cluster.conf"
_NATS_ROUTE_PORT: Final = 6222
Json = dict[str, Any]


def _env(name: str, value: object) -> Json:
    return {"name": env_name(name), "value": str(value)}


def _container(name: str, env: list[Json], mount: bool) -> Json:
    container: Json = {"name": name, "env": env}
    if mount:
        container["volumeMounts"] = [{"name": LOCAL_CONFIG, "mountPath": LOCAL_CONFIG_MOUNT, "readOnly": True}]
    return container


def _patch(kind: str, name: str, containers: list[Json], mount: bool, spec: Json | None = None) -> Json:
    pod: Json = {"containers": containers}
    if mount:
        pod["volumes"] = [{"name": LOCAL_CONFIG, "configMap": {"name": LOCAL_CONFIG}}]
    body: Json = {"template": {"spec": pod}, **(spec or {})}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": body}


def _nats_cluster(servers: int) -> str:
    routes = "\n".join(f"    nats-route://hami-nats-{i}.hami-nats-headless:{_NATS_ROUTE_PORT}" for i in range(servers))
    return (
        "cluster {\n  name: hami\n"
        f"  listen: 0.0.0.0:{_NATS_ROUTE_PORT}\n  no_advertise: true\n  routes: [\n{routes}\n  ]\n"
        "  tls {\n    cert_file: /etc/nats-tls/tls.crt\n    key_file: /etc/nats-tls/tls.key\n"
        "    ca_file: /etc/nats-tls/ca.crt\n    verify: true\n    timeout: 5\n  }\n}\n"
    )


def local_overlay(config: StackConfig, base: str = "dev") -> dict[str, str]:
    """The overlay's files by name: kustomization.yaml and the files its generators read."""
    files: dict[str, str] = {}
    device_config = config.device_config_text()
    node_config = config.node_config_file is not None
    mounted = bool(device_config) or node_config
    config_files = []
    if device_config:
        files[_DEVICE_CONFIG] = device_config
        config_files.append(_DEVICE_CONFIG)
    if node_config:
        files[_NODE_CONFIG] = json.dumps(node_config_document(config), indent=2)
        config_files.append(_NODE_CONFIG)
    shared: list[Json] = []
    if device_config:
        shared.append(_env("device_config_file", f"{LOCAL_CONFIG_MOUNT}/{_DEVICE_CONFIG}"))
    node: list[Json] = list(shared)
    if node_config:
        node.append(_env("node_config_file", f"{LOCAL_CONFIG_MOUNT}/{_NODE_CONFIG}"))
    if not device_config:
        node.append(_env("device_split_count", config.split_count))
    extender = [
        *shared,
        _env("node_scheduler_policy", config.node_policy),
        _env("gpu_scheduler_policy", config.gpu_policy),
        _env("placement_replicas", config.nats_servers),
    ]
    patches = [
        _patch("Deployment", "hami-scheduler", [_container("extender", extender, mounted)], mounted),
        _patch("Deployment", "hami-webhook", [_container("webhook", shared, mounted)], mounted),
        _patch(
            "DaemonSet",
            "hami-node",
            [_container("allocator", node, mounted), _container("nodeagent", node, mounted)],
            mounted,
        ),
    ]
    generators: list[Json] = []
    if config_files:
        generators.append({"name": LOCAL_CONFIG, "files": config_files})
    if config.nats_servers > 1:
        files[_NATS_CLUSTER] = _nats_cluster(config.nats_servers)
        generators.append({"name": "hami-nats", "behavior": "merge", "files": [f"cluster.conf={_NATS_CLUSTER}"]})
        patches.append(
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": "hami-nats"},
                "spec": {
                    "replicas": config.nats_servers,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "nats", "ports": [{"name": "cluster", "containerPort": _NATS_ROUTE_PORT}]}
                            ]
                        }
                    },
                },
            }
        )
    kustomization: Json = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"../{base}"],
        # as the base's: objects without a namespace go to hami-system, the kube-system RoleBinding keeps its own
        "transformers": [
            yaml.safe_dump(
                {
                    "apiVersion": "builtin",
                    "kind": "NamespaceTransformer",
                    "metadata": {"name": "hami-system", "namespace": "hami-system"},
                    "unsetOnly": True,
                },
                sort_keys=False,
            )
        ],
        "patches": [{"patch": yaml.safe_dump(p, sort_keys=False)} for p in patches],
    }
    if generators:
        kustomization["configMapGenerator"] = generators
    files["kustomization.yaml"] = "# the local stack's choices (hami_sim.stack._overlay)\n" + yaml.safe_dump(
        kustomization, sort_keys=False
    )
    return files
