"""From a rendered workload to the processes and files of one of its pods, as a kubelet would make them.

Pure: :class:`PodPlanner` reads the :class:`Rendering` and decides, for one pod of a workload, every
container's argv (``command`` + ``args``, ``$(VAR)`` expanded), environment (values, ``$(VAR)``,
``secretKeyRef``, ``configMapKeyRef``, ``fieldRef``) and the files its volumes hold (Secret, ConfigMap,
projected, downward API), with :mod:`._mapping` applied. Service-account tokens are only named here
(:class:`TokenFile`): the launcher asks the apiserver for them.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from hami_sim.deployed._mapping import IMAGE_FILES, ServiceRoute, map_addresses, relocate
from hami_sim.deployed._render import Rendering

__all__ = ["ContainerPlan", "PodPlan", "PodPlanner", "PodSlot", "TokenFile", "service_routes"]

Json = dict[str, Any]
API_TOKEN_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
_VAR: Final = re.compile(r"\$\((\w+)\)")
_DEFAULT_MODE: Final = 0o644


@dataclass(frozen=True, slots=True)
class PodSlot:
    """One pod to plan: its workload, its name, its node and its loopback address."""

    workload: Json
    name: str
    address: str
    node: str = ""

    @property
    def labels(self) -> Mapping[str, str]:
        labels: Mapping[str, str] = self.workload["spec"]["template"]["metadata"].get("labels") or {}
        return labels

    @property
    def spec(self) -> Json:
        spec: Json = self.workload["spec"]["template"]["spec"]
        return spec


@dataclass(frozen=True, slots=True)
class TokenFile:
    """A projected service-account token the kubelet would request for the pod."""

    path: Path
    account: str
    audience: str  # "" = the apiserver's own
    seconds: int
    api_credentials: bool  # also the pod's in-cluster API access (a kubeconfig is written from it)


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    init: bool
    mounts: Mapping[str, Path]
    program: str  # command[0] as written (what the image would run)


@dataclass(frozen=True, slots=True)
class PodPlan:
    name: str
    namespace: str
    workload: str  # Kind/name
    node: str
    address: str
    service_account: str
    folder: Path
    containers: tuple[ContainerPlan, ...]
    files: Mapping[Path, tuple[bytes, int]] = field(default_factory=dict)
    folders: tuple[Path, ...] = ()
    tokens: tuple[TokenFile, ...] = ()
    api_access: tuple[str, ...] = ()  # containers that reach the apiserver (in-cluster credentials)


def _dns_names(name: str, namespace: str) -> list[str]:
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"]


def _container_port(spec: Json, target: object) -> int | None:
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target:
                return int(port["containerPort"])
    return None


def service_routes(rendering: Rendering, pods: Sequence[PodSlot], namespace: str) -> dict[str, ServiceRoute]:
    """Every DNS name of every rendered Service (and of each pod behind a headless one), by where it leads."""
    routes: dict[str, ServiceRoute] = {}
    for service in rendering.of_kind("Service"):
        meta, spec = service["metadata"], service["spec"]
        selector: Mapping[str, str] = spec.get("selector") or {}
        ns = meta.get("namespace", namespace)
        chosen = [p for p in pods if selector and all(p.labels.get(k) == v for k, v in selector.items())]
        if not chosen:
            continue
        for pod in chosen:
            ports = {}
            for port in spec.get("ports") or []:
                target = _container_port(pod.spec, port.get("targetPort", port["port"]))
                ports[int(port["port"])] = target if target is not None else int(port["port"])
            route = ServiceRoute(pod.address, ports)
            if pod is chosen[0]:
                for dns in _dns_names(meta["name"], ns):
                    routes[dns] = route
            for dns in _dns_names(meta["name"], ns):
                routes[f"{pod.name}.{dns}"] = route
    return routes


class PodPlanner:
    """Plans pods of ``rendering`` under ``root`` (a folder per pod; hostPath volumes under ``nodes``)."""

    def __init__(
        self,
        rendering: Rendering,
        root: Path,
        *,
        routes: Mapping[str, ServiceRoute],
        image: Path,
        namespace: str = "hami-system",
        api_ca: bytes = b"",
        hosts: Path | None = None,
    ) -> None:
        self.rendering = rendering
        self.root = root
        self.hosts = hosts or root / "nodes"  # short where unix sockets live there (107 bytes a path)
        self.routes = routes
        self.image = image
        self.namespace = namespace
        self.api_ca = api_ca

    def node_root(self, node: str) -> Path:
        return self.hosts / (node or "_")

    # --- objects the pod refers to -------------------------------------------------------------------

    def _secret(self, name: str) -> dict[str, bytes]:
        secret = self.rendering.find("Secret", name)
        if secret is None:
            raise LookupError(f"Secret {name} is not in the rendered overlay")
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        data.update({k: str(v).encode() for k, v in (secret.get("stringData") or {}).items()})
        return data

    def _config_map(self, name: str) -> dict[str, bytes]:
        if name == "kube-root-ca.crt":  # kube-controller-manager publishes it in every namespace
            return {"ca.crt": self.api_ca}
        config = self.rendering.find("ConfigMap", name)
        if config is None:
            raise LookupError(f"ConfigMap {name} is not in the rendered overlay")
        return {k: str(v).encode() for k, v in (config.get("data") or {}).items()}

    def _field(self, pod: PodSlot, path: str) -> str:
        fields = {
            "metadata.name": pod.name,
            "metadata.namespace": self.namespace,
            "spec.nodeName": pod.node,
            "spec.serviceAccountName": str(pod.spec.get("serviceAccountName") or "default"),
            "status.podIP": pod.address,
            "status.hostIP": "127.0.0.1",
        }
        if path not in fields:
            raise LookupError(f"fieldRef {path} is not supported here")
        return fields[path]

    # --- volumes --------------------------------------------------------------------------------------

    def _volume(
        self, pod: PodSlot, folder: Path, volume: Json, files: dict[Path, tuple[bytes, int]], tokens: list[TokenFile]
    ) -> Path:
        name = str(volume["name"])
        local = folder / "volumes" / name
        if "hostPath" in volume:
            return self.node_root(pod.node) / str(volume["hostPath"]["path"]).lstrip("/")
        if "secret" in volume:
            source = volume["secret"]
            self._items(self._secret(source["secretName"]), source, local, files)
        elif "configMap" in volume:
            source = volume["configMap"]
            self._items(self._config_map(source["name"]), source, local, files)
        elif "projected" in volume:
            mode = int(volume["projected"].get("defaultMode", _DEFAULT_MODE))
            for part in volume["projected"].get("sources") or []:
                if "serviceAccountToken" in part:
                    token = part["serviceAccountToken"]
                    audience = str(token.get("audience") or "")
                    tokens.append(
                        TokenFile(
                            path=local / token["path"],
                            account=str(pod.spec.get("serviceAccountName") or "default"),
                            audience=audience,
                            seconds=int(token.get("expirationSeconds", 3600)),
                            api_credentials=not audience,
                        )
                    )
                elif "secret" in part:
                    self._items(
                        self._secret(part["secret"]["name"]), {**part["secret"], "defaultMode": mode}, local, files
                    )
                elif "configMap" in part:
                    source = {**part["configMap"], "defaultMode": mode}
                    self._items(self._config_map(part["configMap"]["name"]), source, local, files)
                elif "downwardAPI" in part:
                    for item in part["downwardAPI"].get("items") or []:
                        value = self._field(pod, item["fieldRef"]["fieldPath"])
                        files[local / item["path"]] = (value.encode(), mode)
        # emptyDir, a volumeClaimTemplate's claim: an empty folder of the pod's
        return local

    @staticmethod
    def _items(data: Mapping[str, bytes], source: Json, local: Path, files: dict[Path, tuple[bytes, int]]) -> None:
        mode = int(source.get("defaultMode", _DEFAULT_MODE))
        items = source.get("items")
        chosen = [(i["key"], i["path"], int(i.get("mode", mode))) for i in items] if items else None
        for key, path, item_mode in chosen or [(k, k, mode) for k in data]:
            if key not in data:
                raise LookupError(f"key {key} is not in the volume's source")
            files[local / path] = (data[key], item_mode)

    # --- the pod --------------------------------------------------------------------------------------

    def plan(self, pod: PodSlot) -> PodPlan:
        folder = self.root / "pods" / pod.name
        files: dict[Path, tuple[bytes, int]] = {}
        tokens: list[TokenFile] = []
        volumes = {v["name"]: self._volume(pod, folder, v, files, tokens) for v in pod.spec.get("volumes") or []}
        for claim in pod.workload["spec"].get("volumeClaimTemplates") or []:
            volumes.setdefault(claim["metadata"]["name"], folder / "volumes" / claim["metadata"]["name"])
        automount = pod.spec.get("automountServiceAccountToken", True) is not False
        containers: list[ContainerPlan] = []
        api_access: list[str] = []
        all_mounts: dict[str, Path] = {IMAGE_FILES: self.image}
        for init, entries in ((True, pod.spec.get("initContainers") or []), (False, pod.spec["containers"])):
            for container in entries:
                mounts: dict[str, Path] = {IMAGE_FILES: self.image}
                for mount in container.get("volumeMounts") or []:
                    local = volumes[mount["name"]]
                    mounts[mount["mountPath"]] = local / mount["subPath"] if mount.get("subPath") else local
                all_mounts.update(mounts)
                if automount or API_TOKEN_DIR in mounts:
                    api_access.append(container["name"])
                containers.append(self._container(pod, container, init, mounts))
        # ConfigMap files name paths of the pod's mounts and its loopback (kube-scheduler's config does)
        moved = {
            path: (map_addresses(relocate(data.decode(), all_mounts), pod.address, self.routes).encode(), mode)
            if _is_text(data) and _from_config_map(path, pod, folder)
            else (data, mode)
            for path, (data, mode) in files.items()
        }
        kind, name = pod.workload["kind"], pod.workload["metadata"]["name"]
        return PodPlan(
            name=pod.name,
            namespace=self.namespace,
            workload=f"{kind}/{name}",
            node=pod.node,
            address=pod.address,
            service_account=str(pod.spec.get("serviceAccountName") or "default"),
            folder=folder,
            containers=tuple(containers),
            files=moved,
            folders=tuple(sorted(set(volumes.values()))),
            tokens=tuple(tokens),
            api_access=tuple(api_access),
        )

    def _container(self, pod: PodSlot, container: Json, init: bool, mounts: Mapping[str, Path]) -> ContainerPlan:
        env: dict[str, str] = {}
        for entry in container.get("env") or []:
            env[entry["name"]] = self._env_value(pod, entry, env, mounts)
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                data = self._secret(source["secretRef"]["name"])
            else:
                data = self._config_map(source["configMapRef"]["name"])
            prefix = str(source.get("prefix") or "")
            for key, value in data.items():
                env.setdefault(prefix + key, value.decode())
        command = [str(c) for c in container.get("command") or []]
        args = [str(a) for a in container.get("args") or []]
        if not command:  # the image's entry point: the images here run their program by its own name
            command = [str(container["image"]).rsplit("/", 1)[-1].split(":", 1)[0]]
        argv = tuple(
            map_addresses(relocate(_expand(part, env), mounts), pod.address, self.routes) for part in [*command, *args]
        )
        return ContainerPlan(
            name=container["name"], argv=argv, env=env, init=init, mounts=dict(mounts), program=command[0]
        )

    def _env_value(self, pod: PodSlot, entry: Json, env: Mapping[str, str], mounts: Mapping[str, Path]) -> str:
        if "value" in entry or "valueFrom" not in entry:
            value = _expand(str(entry.get("value", "")), env)
            return map_addresses(relocate(value, mounts), pod.address, self.routes)
        source = entry["valueFrom"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return self._secret(ref["name"])[ref["key"]].decode()
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return self._config_map(ref["name"])[ref["key"]].decode()
        if "fieldRef" in source:
            return self._field(pod, source["fieldRef"]["fieldPath"])
        raise LookupError(f"env {entry['name']}: {sorted(source)} is not supported here")


def _expand(text: str, env: Mapping[str, str]) -> str:
    """$(NAME) of a variable defined earlier, as the kubelet expands it; $$(NAME) stays literal."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def _is_text(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def _from_config_map(path: Path, pod: PodSlot, folder: Path) -> bool:
    """Whether the file came from a ConfigMap volume (Secrets are never rewritten: certificates, keys)."""
    volumes = {v["name"]: v for v in pod.spec.get("volumes") or []}
    try:
        name = path.relative_to(folder / "volumes").parts[0]
    except ValueError:
        return False
    return "configMap" in volumes.get(name, {})
