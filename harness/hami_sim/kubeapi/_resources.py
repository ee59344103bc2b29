"""The resource types the emulator serves, and the discovery documents that describe them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = ["RESOURCES", "ResourceType", "api_group_list", "api_resource_list", "api_versions", "find"]

JsonObj = dict[str, Any]

_RW: Final = ("create", "delete", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    singular: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"


RESOURCES: Final = (
    ResourceType("", "v1", "namespaces", "Namespace", False, ("ns",), ("status",), "namespace"),
    ResourceType("", "v1", "pods", "Pod", True, ("po",), ("status", "binding"), "pod"),
    ResourceType("", "v1", "nodes", "Node", False, ("no",), ("status",), "node"),
    ResourceType("", "v1", "resourcequotas", "ResourceQuota", True, ("quota",), ("status",), "resourcequota"),
    ResourceType("", "v1", "events", "Event", True, ("ev",), (), "event"),
    ResourceType("", "v1", "bindings", "Binding", True, (), (), "binding"),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True, (), (), "lease"),
    ResourceType(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        True,
        ("pdb",),
        ("status",),
        "poddisruptionbudget",
    ),
    ResourceType(
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        False,
        (),
        (),
        "mutatingwebhookconfiguration",
    ),
)

# Kinds that are only ever created (POST), never stored: the legacy ``bindings`` collection.
CREATE_ONLY: Final = frozenset({"bindings"})


def find(group: str, version: str, plural: str) -> ResourceType | None:
    for rt in RESOURCES:
        if rt.group == group and rt.version == version and rt.plural == plural:
            return rt
    return None


def api_versions(server_address: str) -> JsonObj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _groups() -> list[str]:
    return sorted({rt.group for rt in RESOURCES if rt.group})


def api_group_list() -> JsonObj:
    groups = []
    for group in _groups():
        gv = {"groupVersion": f"{group}/v1", "version": "v1"}
        groups.append({"name": group, "versions": [gv], "preferredVersion": gv})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(group: str) -> JsonObj | None:
    if group not in _groups():
        return None
    gv = {"groupVersion": f"{group}/v1", "version": "v1"}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [gv], "preferredVersion": gv}


def api_resource_list(group: str, version: str) -> JsonObj | None:
    types = [rt for rt in RESOURCES if rt.group == group and rt.version == version]
    if not types:
        return None
    resources: list[JsonObj] = []
    for rt in types:
        verbs = ["create"] if rt.plural in CREATE_ONLY else [*_RW, "deletecollection"]
        entry: JsonObj = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": verbs,
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.plural in ("pods", "nodes"):
            entry["categories"] = ["all"] if rt.plural == "pods" else []
        resources.append(entry)
        for sub in rt.subresources:
            sub_verbs = ["create"] if sub == "binding" else ["get", "patch", "update"]
            sub_kind = "Binding" if sub == "binding" else rt.kind
            resources.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": sub_kind,
                    "verbs": sub_verbs,
                }
            )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
