"""The API emulator learns from the real one: the same requests to ``hami_sim.kubeapi`` and to kube-apiserver.

Each scenario runs twice, against the real control plane (etcd + kube-apiserver built by ``make k8s``, the
admin's client certificates) and against the emulator, through the official ``kubernetes`` client and the
real kubectl. What comes back is reduced to a *view* (status codes, the ``reason``/``code`` of Status
objects, the fields our code reads, kubectl's columns) after normalising what is volatile or irrelevant
(``normalise`` says what and why). The views must be equal, except where ``KNOWN`` names a difference: each
entry there asserts what the real apiserver does and what the emulator does instead, and mirrors a line of
docs/kube-emulator.md ("Where the emulator differs from kube-apiserver"). A difference that goes away fails
too, so the list stays true.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from hami_common.kube import guarded_annotation_patch, json_patch_body
from hami_sim.kubeapi import KubeApiEmulator
from hami_sim.realk8s import ControlPlane, K8sBinaries
from tests.kube.hookserver import MUTATED, HookServer, closed_port, hook_server, webhook

pytestmark = pytest.mark.timeout(180)

Json = dict[str, Any]
View = dict[str, Any]
MERGE: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC: Final = "application/strategic-merge-patch+json"
_TIME: Final = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
_AGE: Final = re.compile(r"^(<unknown>|\d+[smhdy](\d+[smhd])?)$")

# --- what is normalised away, on both sides, before comparing ------------------------------------------------

# Identity and bookkeeping differ on every write on any two servers: never compared. (``generation``, which
# kube-apiserver counts for pods and webhook configurations, is read by kubelets and controllers only.)
VOLATILE_METADATA: Final = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "selfLink", "generation")
# Defaults kube-apiserver fills in that nothing in this project reads (HAMi's webhook, extender, allocator and
# node agent read names, labels, annotations, resources, nodeName, schedulerName, phase and conditions).
# Removed from both sides; the emulator does not invent them. Paths: dotted, ``[*]`` for every list item,
# a trailing ``={}`` for "only when empty".
IRRELEVANT_DEFAULTS: Final = {
    "Pod": (
        "spec.containers[*].terminationMessagePath",
        "spec.containers[*].terminationMessagePolicy",
        "spec.containers[*].imagePullPolicy",
        "spec.containers[*].resources={}",  # a pod that asks for nothing
        "spec.securityContext",
        "spec.enableServiceLinks",
        "spec.preemptionPolicy",  # the Priority admission plugin
        "spec.priority",
        "spec.tolerations",  # DefaultTolerationSeconds admission: not-ready/unreachable for 300 s
        "status.qosClass",
    ),
    "Node": (
        "status.daemonEndpoints",  # Go zero values the real apiserver serialises for a Node without a kubelet
        "status.nodeInfo",
    ),
}


def _drop(obj: Any, path: list[str]) -> None:
    if not path:
        return
    only_empty = path[-1].endswith("={}") and len(path) == 1
    path = [path[0].removesuffix("={}"), *path[1:]] if only_empty else path
    head, rest = path[0], path[1:]
    if head.endswith("[*]"):
        items = obj.get(head[:-3]) if isinstance(obj, dict) else None
        for item in items if isinstance(items, list) else []:
            if rest:
                _drop(item, rest)
        return
    if not isinstance(obj, dict) or head not in obj:
        return
    if rest:
        _drop(obj[head], rest)
    elif not only_empty or obj[head] == {}:
        del obj[head]


# Go writes the zero value of a struct field that has no ``omitempty`` (a condition's null lastProbeTime, a
# container's empty lastState, an event's null eventTime); the emulator stores what it was sent. Nothing here
# reads those zero values, so they are dropped on both sides.
GO_ZERO_VALUES: Final[dict[str, Any]] = {
    "lastProbeTime": None,
    "lastTransitionTime": None,
    "lastState": {},
    "eventTime": None,
    "reportingComponent": "",
    "reportingInstance": "",
}


def _zero_values(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _zero_values(v) for k, v in value.items() if not (k in GO_ZERO_VALUES and v == GO_ZERO_VALUES[k])}
    if isinstance(value, list):
        return [_zero_values(v) for v in value]
    return value


def _times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_times(v) for v in value]
    if isinstance(value, str) and _TIME.match(value):
        return "<time>"
    return value


_PORT: Final = re.compile(r"127\.0\.0\.1:\d+")


def normalise(obj: Any, kind: str = "") -> Any:
    """An object (or list) with volatile metadata, timestamps, Go's zero values, loopback ports and the
    irrelevant defaults removed. ``kind``: the kind of a list's items (which carry none)."""
    if isinstance(obj, str):
        return _PORT.sub("127.0.0.1:<port>", obj)
    if isinstance(obj, list):
        return [normalise(item, kind) for item in obj]
    if not isinstance(obj, dict):
        return obj
    result = {key: normalise(value) for key, value in obj.items()}
    kind = str(result.get("kind") or kind)
    if isinstance(obj.get("items"), list):
        result["items"] = [normalise(item, kind.removesuffix("List")) for item in obj["items"]]
    metadata = result.get("metadata")
    if isinstance(metadata, dict):
        for key in (*VOLATILE_METADATA, "continue", "remainingItemCount"):
            metadata.pop(key, None)
    for path in IRRELEVANT_DEFAULTS.get(kind, ()):
        _drop(result, path.split("."))
    return _zero_values(_times(result))


# --- the two sides -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    code: int
    body: Any


def status_view(outcome: Outcome, *, message: bool = False) -> View:
    """What callers may rely on in an answer: the code, and for a Status its reason, code and details;
    ``message`` where callers read it too (webhook refusals, conflicts, validation)."""
    body = outcome.body if isinstance(outcome.body, dict) else {}
    if body.get("kind") != "Status":
        return {"code": outcome.code}
    details = body.get("details") or {}
    view: View = {
        "code": outcome.code,
        "status": body.get("status"),
        "reason": body.get("reason", ""),
        "status.code": body.get("code"),
        "details": {k: details[k] for k in ("name", "kind", "group") if k in details},
    }
    if message:
        view["message"] = normalise(body.get("message"))
        view["causes"] = [{k: c.get(k) for k in ("reason", "field")} for c in details.get("causes") or []]
    return view


@dataclass
class Side:
    name: str
    api: Any  # kubernetes.client.ApiClient
    kubeconfig: Path
    kubectl_binary: str
    namespace: str
    home: Path

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)

    @property
    def leases(self) -> Any:
        return client.CoordinationV1Api(self.api)

    @property
    def admission(self) -> Any:
        return client.AdmissionregistrationV1Api(self.api)

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
        """One request through the official client, its raw answer kept (the typed models drop fields)."""
        try:
            response = method(*args, _preload_content=False, **kwargs)
        except ApiException as err:
            return Outcome(int(err.status), json.loads(err.body) if err.body else None)
        data = response.data
        return Outcome(int(response.status), json.loads(data) if data else None)

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, HOME=str(self.home))
        env.pop("KUBECONFIG", None)
        return subprocess.run(
            [self.kubectl_binary, "--kubeconfig", str(self.kubeconfig), "-n", self.namespace, *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )


def _side(name: str, kubeconfig: Path, kubectl_binary: str, namespace: str, home: Path) -> Side:
    api = config.new_client_from_config(str(kubeconfig))  # type: ignore[no-untyped-call]
    return Side(name, api, kubeconfig, kubectl_binary, namespace, home)


@pytest.fixture(scope="module")
def emulator() -> Iterator[KubeApiEmulator]:
    with KubeApiEmulator(bookmark_interval=0.5) as api:
        yield api


@pytest.fixture
def sides(plane: ControlPlane, emulator: KubeApiEmulator, k8s: K8sBinaries, tmp_path: Path) -> Iterator[list[Side]]:
    """[real, emulator], each with the same fresh namespace (the real apiserver is shared by the session)."""
    namespace = f"diff-{uuid.uuid4().hex[:8]}"
    made = []
    for name, kubeconfig in (
        ("real", plane.write_kubeconfig(tmp_path / "real.kubeconfig")),
        ("emulator", emulator.write_kubeconfig(tmp_path / "emulator.kubeconfig")),
    ):
        home = tmp_path / f"home-{name}"
        home.mkdir()
        side = _side(name, kubeconfig, k8s["kubectl"], namespace, home)
        side.core.create_namespace({"metadata": {"name": namespace}})
        made.append(side)
    yield made
    for side in made:
        with contextlib.suppress(ApiException):
            side.core.delete_namespace(namespace)
        side.api.close()


# --- known differences ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """A difference kept on purpose: ``holds(real, emulator)`` asserts both sides' behaviour exactly."""

    why: str  # the line in docs/kube-emulator.md
    holds: Callable[[Any, Any], bool]


_KNOWN_SCENARIO: Final = "known differences"
KNOWN: Final[dict[tuple[str, str], Known]] = {
    (_KNOWN_SCENARIO, "bound pod after delete"): Known(
        "graceful deletion: a pod on a node is marked (deletionTimestamp, 30 s grace) and stays Terminating "
        "until its kubelet confirms; the emulator, which has no kubelet, marks it and removes it at once",
        lambda real, emulated: real == 200 and emulated == 404,
    ),
    (_KNOWN_SCENARIO, "server-side apply"): Known(
        "server-side apply is refused with 415 UnsupportedMediaType",
        lambda real, emulated: real == 201 and emulated == 415,
    ),
    (_KNOWN_SCENARIO, "namespace after delete"): Known(
        "deleting a namespace marks it Terminating and then deletes it and its objects at once "
        "(on kube-apiserver it stays Terminating until kube-controller-manager's namespace controller empties it)",
        lambda real, emulated: real == 200 and emulated == 404,
    ),
}


def compare(scenario: str, real: View, emulated: View) -> None:
    assert real.keys() == emulated.keys()
    for key in real:
        known = KNOWN.get((scenario, key))
        if known is None:
            assert emulated[key] == real[key], f"{scenario}: {key!r} differs"
        else:
            assert real[key] != emulated[key], f"{scenario}: {key!r} agrees now: drop it from KNOWN and the docs"
            assert known.holds(real[key], emulated[key]), f"{scenario}: {key!r} is not the known difference"


# --- request bodies ------------------------------------------------------------------------------------------


def pod(name: str, labels: dict[str, str] | None = None, **extra: Any) -> Json:
    body: Json = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }
    body.update(extra)
    return body


def gpu_pod(name: str, labels: dict[str, str] | None = None) -> Json:
    body = pod(name, labels)
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1", "cpu": "500m"}}
    return body


def node(name: str) -> Json:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"gpu": "on"}}}


def node_status() -> Json:
    return {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "capacity": {"nvidia.com/gpu": "8", "cpu": "16", "pods": "110"},
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "16", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": "10.1.2.3"}],
        }
    }


def running_status(ready: bool) -> Json:
    status: Json = {
        "phase": "Running",
        "podIP": "10.4.0.7",
        "podIPs": [{"ip": "10.4.0.7"}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    if ready:
        status["containerStatuses"] = [
            {
                "name": "main",
                "image": "busybox:1.36",
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
            }
        ]
    return {"status": status}


def event(name: str, pod_name: str, namespace: str, reason: str) -> Json:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": namespace, "apiVersion": "v1"},
        "reason": reason,
        "message": f"{reason} for {pod_name}",
        "type": "Normal",
        "source": {"component": "hami-scheduler"},
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
        "count": 1,
    }


def names(outcome: Outcome) -> list[str]:
    return [item["metadata"]["name"] for item in (outcome.body or {}).get("items", [])]


def object_view(outcome: Outcome) -> View:
    return {"code": outcome.code, "object": normalise(outcome.body)}


# --- kubectl output ------------------------------------------------------------------------------------------

_COLUMN: Final = re.compile(r"\S+(?: \S+)*")
_VOLATILE_COLUMNS: Final = frozenset({"AGE", "LAST SEEN", "FIRST SEEN"})


def columns(text: str) -> list[list[str]]:
    """kubectl's table as rows of cells, sliced at the header's column starts; ages read ``<age>``."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    header = [(m.start(), m.group()) for m in _COLUMN.finditer(lines[0])]
    rows = [[name for _, name in header]]
    for line in lines[1:]:
        cells = []
        for i, (start, name) in enumerate(header):
            end = header[i + 1][0] if i + 1 < len(header) else len(line)
            cell = line[start:end].strip()
            cells.append("<age>" if name in _VOLATILE_COLUMNS and _AGE.match(cell) else cell)
        rows.append(cells)
    return rows


TABLE: Final = "application/json;as=Table;v=v1;g=meta.k8s.io, application/json"


def table_view(outcome: Outcome) -> View:
    """A server-side Table: its columns (descriptions aside, which kubectl never prints) and its cells."""
    body = outcome.body or {}
    columns_ = [
        {k: c.get(k) for k in ("name", "type", "format", "priority")} for c in body.get("columnDefinitions", [])
    ]
    ages = {i for i, c in enumerate(columns_) if c["name"] in ("Age", "Last Seen", "First Seen")}
    rows = [
        ["<age>" if i in ages else cell for i, cell in enumerate(row.get("cells", []))] for row in body.get("rows", [])
    ]
    kinds = [(row.get("object") or {}).get("kind") for row in body.get("rows", [])]
    return {"code": outcome.code, "kind": body.get("kind"), "columns": columns_, "rows": rows, "objects": kinds}


def kubectl_view(done: subprocess.CompletedProcess[str]) -> View:
    return {"rc": done.returncode, "table": columns(done.stdout), "stderr": done.stderr.strip()}


_DESCRIBE_VOLATILE: Final = frozenset({"Start Time", "Annotations", "Labels"})
# What kubectl describe prints of IRRELEVANT_DEFAULTS (spec.priority, spec.tolerations): dropped when it is
# only those defaults (or their absence).
_DESCRIBE_DEFAULTS: Final = {
    "Priority": ("0",),
    "Tolerations": ("<none>", "node.kubernetes.io/not-ready:NoExecute op=Exists for 300s"),
}


def describe_view(text: str) -> dict[str, str]:
    """``kubectl describe``'s top-level ``Field: value`` lines (timestamps, uids and the like removed)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Z][A-Za-z -]*):\s*(.*)$", line)
        if not match or match.group(1) in _DESCRIBE_VOLATILE:
            continue
        name, value = match.group(1), match.group(2).strip()
        if value not in _DESCRIBE_DEFAULTS.get(name, ()):
            fields[name] = value
    return fields


# --- scenarios -----------------------------------------------------------------------------------------------


def pods_get_list_select(side: Side) -> View:
    core, ns = side.core, side.namespace
    view: View = {"create": object_view(side.call(core.create_namespaced_pod, ns, pod("web-1", {"app": "web"})))}
    side.call(core.create_namespaced_pod, ns, pod("web-2", {"app": "web", "tier": "gpu"}))
    side.call(core.create_namespaced_pod, ns, pod("db-1", {"app": "db"}))
    view["get"] = object_view(side.call(core.read_namespaced_pod, "web-1", ns))
    view["list"] = object_view(side.call(core.list_namespaced_pod, ns))
    for selector in ("app=web", "app in (web,db),tier!=gpu", "tier", "!tier", "app notin (web)"):
        view[f"labels {selector}"] = names(side.call(core.list_namespaced_pod, ns, label_selector=selector))
    for selector in ("metadata.name=web-2", "status.phase=Pending", "spec.nodeName=", "metadata.name!=db-1"):
        view[f"fields {selector}"] = names(side.call(core.list_namespaced_pod, ns, field_selector=selector))
    paged = side.call(core.list_namespaced_pod, ns, limit=2)
    view["page 1"] = (names(paged), (paged.body["metadata"].get("remainingItemCount")))
    token = paged.body["metadata"].get("continue")
    view["page 2"] = names(side.call(core.list_namespaced_pod, ns, limit=2, _continue=token))
    return view


def pod_annotation_patches(side: Side) -> View:
    core, ns = side.core, side.namespace
    side.call(core.create_namespaced_pod, ns, pod("p"))
    view: View = {}

    def annotations(outcome: Outcome) -> Any:
        return (outcome.code, ((outcome.body or {}).get("metadata") or {}).get("annotations"))

    merge = {"metadata": {"annotations": {"hami.io/a": "1", "hami.io/b": "2"}}}
    view["merge"] = annotations(side.call(core.patch_namespaced_pod, "p", ns, merge, _content_type=MERGE))
    remove = {"metadata": {"annotations": {"hami.io/a": None}}}
    view["merge null"] = annotations(side.call(core.patch_namespaced_pod, "p", ns, remove, _content_type=MERGE))
    ops = [
        {"op": "add", "path": "/metadata/annotations/hami.io~1c", "value": "3"},
        {"op": "replace", "path": "/metadata/annotations/hami.io~1b", "value": "two"},
    ]
    view["json"] = annotations(side.call(core.patch_namespaced_pod, "p", ns, ops, _content_type=JSON_PATCH))
    failing = [{"op": "test", "path": "/metadata/annotations/hami.io~1b", "value": "nope"}]
    view["json test fails"] = status_view(
        side.call(core.patch_namespaced_pod, "p", ns, failing, _content_type=JSON_PATCH)
    )
    missing = [{"op": "remove", "path": "/metadata/annotations/absent"}]
    view["json remove missing"] = status_view(
        side.call(core.patch_namespaced_pod, "p", ns, missing, _content_type=JSON_PATCH)
    )
    strategic = {"metadata": {"annotations": {"hami.io/d": "4", "hami.io/c": None}}}
    view["strategic"] = annotations(side.call(core.patch_namespaced_pod, "p", ns, strategic, _content_type=STRATEGIC))
    labels = {"metadata": {"labels": {"a": "b"}, "annotations": {"hami.io/e": "5"}}}
    view["strategic labels"] = annotations(
        side.call(core.patch_namespaced_pod, "p", ns, labels, _content_type=STRATEGIC)
    )
    return view


def guarded_annotation_patches(side: Side) -> View:
    """The allocator's acknowledgement (``guarded_annotation_patch``): a status write it did not see does not
    refuse it, a change to the value it read does (422); a pod without labels gets the map, guarded by the
    resourceVersion, so a status write it did not see refuses that one."""
    core, ns = side.core, side.namespace
    annotations = {"hami.io/list": "a;b", "hami.io/gone": "x"}
    bodies = {name: pod(name, labels) for name, labels in (("p", {"app": "a"}), ("bare", None))}
    for body in bodies.values():
        body["metadata"]["annotations"] = annotations
    read = side.call(core.create_namespaced_pod, ns, bodies["p"]).body
    bare = side.call(core.create_namespaced_pod, ns, bodies["bare"]).body
    meta = read["metadata"]
    status = {"status": {"phase": "Running"}}
    for name in bodies:
        side.call(core.patch_namespaced_pod_status, name, ns, status, _content_type=MERGE)

    def guarded(current: Json, value: str, guards: tuple[str, ...] = ("hami.io/list",)) -> Outcome:
        name = current["metadata"]["name"]
        ops = guarded_annotation_patch(
            current["metadata"].get("annotations") or {},
            uid=current["metadata"]["uid"],
            resource_version=current["metadata"]["resourceVersion"],
            guards=guards,
            changes={"hami.io/list": value, "hami.io/gone": None},
            labels={"hami.io/vgpu-node": "n1"},
            read_labels=current["metadata"].get("labels") or {},
        )
        return side.call(core.patch_namespaced_pod, name, ns, json_patch_body(ops), _content_type=JSON_PATCH)

    def written(outcome: Outcome) -> Any:
        body = outcome.body or {}
        return (
            outcome.code,
            (body.get("metadata") or {}).get("annotations"),
            (body.get("metadata") or {}).get("labels"),
        )

    view: View = {"after a status write": written(guarded(read, "b"))}
    view["the value read changed"] = status_view(guarded(read, "c"))
    view["guarded by a key the copy lacks"] = status_view(guarded(read, "c", ("hami.io/absent",)))
    other = {**read, "metadata": {**meta, "uid": "00000000-0000-0000-0000-000000000000"}}
    view["another pod of the same name"] = status_view(guarded(other, "c"))
    view["no labels, after a status write"] = status_view(guarded(bare, "b"))
    fresh = side.call(core.read_namespaced_pod, "bare", ns).body
    view["no labels"] = written(guarded(fresh, "b"))
    return view


def stale_resource_version(side: Side) -> View:
    core, ns = side.core, side.namespace
    created = side.call(core.create_namespaced_pod, ns, pod("p")).body
    side.call(core.patch_namespaced_pod, "p", ns, {"metadata": {"labels": {"x": "1"}}}, _content_type=MERGE)
    stale = created["metadata"]["resourceVersion"]
    patch = {"metadata": {"resourceVersion": stale, "annotations": {"hami.io/x": "1"}}}
    view: View = {"patch": status_view(side.call(core.patch_namespaced_pod, "p", ns, patch, _content_type=MERGE))}
    replaced = copy.deepcopy(created)
    replaced["metadata"]["labels"] = {"y": "2"}
    view["put"] = status_view(side.call(core.replace_namespaced_pod, "p", ns, replaced))
    current = side.call(core.read_namespaced_pod, "p", ns).body
    current["metadata"]["labels"] = {"y": "2"}
    view["put current"] = status_view(side.call(core.replace_namespaced_pod, "p", ns, current))
    missing_rv = copy.deepcopy(current)
    del missing_rv["metadata"]["resourceVersion"]
    view["put without resourceVersion"] = status_view(side.call(core.replace_namespaced_pod, "p", ns, missing_rv))
    body = {"preconditions": {"resourceVersion": stale}}
    deleted = side.call(core.delete_namespaced_pod, "p", ns, body=body)
    view["delete stale"] = status_view(deleted)
    view["delete stale message"] = re.sub(r"\(\d+\)", "(<rv>)", deleted.body["message"])
    return view


def binding(side: Side) -> View:
    core, ns = side.core, side.namespace
    side.call(core.create_namespaced_pod, ns, pod("p"))
    body = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p", "annotations": {"hami.io/bind-phase": "allocating"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1"},
    }
    first = side.call(core.create_namespaced_binding, ns, body)
    view: View = {"bind": {"code": first.code, "body": first.body}}
    view["bind again"] = status_view(side.call(core.create_namespaced_binding, ns, body), message=True)
    bound = side.call(core.read_namespaced_pod, "p", ns).body
    view["bound pod"] = {
        "nodeName": bound["spec"].get("nodeName"),
        "annotations": bound["metadata"].get("annotations"),
        "conditions": _times(bound["status"].get("conditions")),
    }
    view["nodeName patch"] = status_view(
        side.call(core.patch_namespaced_pod, "p", ns, {"spec": {"nodeName": "other"}}, _content_type=MERGE)
    )
    side.call(core.create_namespaced_pod, ns, pod("q"))
    wrong = {**body, "metadata": {"name": "other"}}
    view["name mismatch"] = status_view(side.call(core.create_namespaced_pod_binding, "q", ns, wrong))
    missing = {**body, "metadata": {"name": "absent"}}
    view["missing pod"] = status_view(side.call(core.create_namespaced_binding, ns, missing))
    return view


def pod_status(side: Side) -> View:
    core, ns = side.core, side.namespace
    side.call(core.create_namespaced_pod, ns, pod("ready"))
    side.call(core.create_namespaced_pod, ns, pod("bare"))
    patched = side.call(core.patch_namespaced_pod_status, "ready", ns, running_status(True), _content_type=MERGE)
    view: View = {"status patch": object_view(patched)}
    bare = {"status": {"phase": "Running"}}
    view["bare status"] = object_view(
        side.call(core.patch_namespaced_pod_status, "bare", ns, bare, _content_type=MERGE)
    )
    view["spec via status"] = object_view(
        side.call(
            core.patch_namespaced_pod_status, "bare", ns, {"metadata": {"labels": {"l": "v"}}}, _content_type=MERGE
        )
    )
    view["status via main"] = object_view(
        side.call(core.patch_namespaced_pod, "bare", ns, {"status": {"phase": "Failed"}}, _content_type=MERGE)
    )
    view["kubectl get pods"] = kubectl_view(side.kubectl("get", "pods"))
    view["kubectl get pods -o wide"] = kubectl_view(side.kubectl("get", "pods", "-o", "wide"))
    return view


def nodes(side: Side) -> View:
    core, name = side.core, f"node-{side.namespace}"
    view: View = {"create": object_view(side.call(core.create_node, node(name)))}
    view["status patch"] = object_view(side.call(core.patch_node_status, name, node_status(), _content_type=MERGE))
    cordon = {"spec": {"unschedulable": True}}
    view["cordon"] = object_view(side.call(core.patch_node, name, cordon, _content_type=STRATEGIC))
    view["fields"] = names(side.call(core.list_node, field_selector=f"metadata.name={name},spec.unschedulable=true"))
    view["kubectl get node"] = kubectl_view(side.kubectl("get", "node", name))
    view["kubectl get node -o wide"] = kubectl_view(side.kubectl("get", "node", name, "-o", "wide"))
    view["delete"] = status_view(side.call(core.delete_node, name))
    view["delete again"] = status_view(side.call(core.delete_node, name))
    return view


def events(side: Side) -> View:
    core, ns = side.core, side.namespace
    side.call(core.create_namespaced_pod, ns, pod("p"))
    view: View = {
        "create": object_view(side.call(core.create_namespaced_event, ns, event("p.1", "p", ns, "Filtering")))
    }
    side.call(core.create_namespaced_event, ns, event("p.2", "p", ns, "BindingSucceed"))
    view["by reason"] = names(side.call(core.list_namespaced_event, ns, field_selector="reason=BindingSucceed"))
    view["by object"] = names(
        side.call(core.list_namespaced_event, ns, field_selector="involvedObject.name=p,involvedObject.kind=Pod")
    )
    view["by source"] = names(side.call(core.list_namespaced_event, ns, field_selector="source=hami-scheduler"))
    other = event("p.3", "p", "elsewhere", "Mismatch")
    view["other namespace"] = status_view(side.call(core.create_namespaced_event, ns, other), message=True)
    view["source.component"] = status_view(
        side.call(core.list_namespaced_event, ns, field_selector="source.component=hami-scheduler")
    )
    view["kubectl get events"] = kubectl_view(side.kubectl("get", "events"))
    view["kubectl get events -o wide"] = kubectl_view(side.kubectl("get", "events", "-o", "wide"))
    return view


def leases(side: Side) -> View:
    api, ns = side.leases, side.namespace
    body = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "hami-scheduler"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 0},
    }
    created = side.call(api.create_namespaced_lease, ns, body)
    view: View = {"create": object_view(created)}
    view["create again"] = status_view(side.call(api.create_namespaced_lease, ns, body))
    # The client (v37) turns a MicroTime string into a datetime and sends its isoformat(): with whole
    # seconds that has no fraction, which kube-apiserver refuses (400). LeaderElector formats its own.
    whole = copy.deepcopy(created.body)
    whole["spec"].update(holderIdentity="b", renewTime="2026-01-01T00:00:00.000000Z")
    view["micro time without fraction"] = status_view(
        side.call(api.replace_namespaced_lease, "hami-scheduler", ns, whole)
    )
    taken = copy.deepcopy(created.body)
    taken["spec"].update(holderIdentity="b", leaseTransitions=1, renewTime="2026-01-01T00:00:00.250000Z")
    updated = side.call(api.replace_namespaced_lease, "hami-scheduler", ns, taken)
    view["update"] = object_view(updated)
    view["renewTime"] = updated.body["spec"]["renewTime"]
    stale = copy.deepcopy(created.body)
    stale["spec"]["holderIdentity"] = "c"
    view["update stale"] = status_view(
        side.call(api.replace_namespaced_lease, "hami-scheduler", ns, stale), message=True
    )
    view["delete"] = status_view(side.call(api.delete_namespaced_lease, "hami-scheduler", ns))
    view["kubectl get leases"] = kubectl_view(side.kubectl("get", "leases"))
    return view


def create_with_status(side: Side) -> View:
    """What a create keeps of a status it is sent, and the defaults derived from it."""
    core, ns = side.core, side.namespace
    running = pod("sent-running", status={"phase": "Running", "podIP": "10.9.9.9"})
    gated = pod("gated")
    gated["spec"]["schedulingGates"] = [{"name": "hami.io/wait"}]
    node_name = f"seeded-{ns}"
    seeded = {**node(node_name), "status": {"capacity": {"nvidia.com/gpu": "4"}}}
    quota = {"metadata": {"name": "q"}, "spec": {"hard": {"pods": "3"}}, "status": {"hard": {"pods": "9"}}}
    namespace = {"metadata": {"name": f"{ns}-sent"}, "status": {"phase": "Terminating"}}
    view: View = {
        "pod": normalise(side.call(core.create_namespaced_pod, ns, running).body)["status"],
        "gated pod": normalise(side.call(core.create_namespaced_pod, ns, gated).body)["status"],
        "node": normalise(side.call(core.create_node, seeded).body)["status"],
        "quota": normalise(side.call(core.create_namespaced_resource_quota, ns, quota).body).get("status"),
        "namespace": normalise(side.call(core.create_namespace, namespace).body)["status"],
    }
    side.call(core.delete_node, node_name)
    side.call(core.delete_namespace, f"{ns}-sent")
    return view


def watch_one_pod(side: Side) -> View:
    core, ns = side.core, side.namespace
    start = side.call(core.list_namespaced_pod, ns).body["metadata"]["resourceVersion"]
    seen: list[tuple[str, str, str, bool]] = []
    done = threading.Event()

    def follow() -> None:
        stream: Any = watch.Watch()  # type: ignore[no-untyped-call]
        for item in stream.stream(core.list_namespaced_pod, ns, resource_version=start, timeout_seconds=20):
            obj = item["object"]
            marked = obj.metadata.deletion_timestamp is not None
            seen.append((item["type"], obj.metadata.name, (obj.metadata.labels or {}).get("step", ""), marked))
            if item["type"] == "DELETED":
                break
        stream.stop()
        done.set()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    side.call(core.create_namespaced_pod, ns, pod("w", {"step": "created"}))
    side.call(core.patch_namespaced_pod, "w", ns, {"metadata": {"labels": {"step": "labelled"}}}, _content_type=MERGE)
    deleted = side.call(core.delete_namespaced_pod, "w", ns)
    assert done.wait(30), f"{side.name}: the watch did not see the pod deleted: {seen}"
    thread.join(5)
    meta = deleted.body["metadata"]
    return {
        "events": seen,
        "delete answer": (deleted.code, deleted.body["kind"], meta.get("deletionGracePeriodSeconds")),
    }


def kubectl_pods(side: Side) -> View:
    core, ns = side.core, side.namespace
    side.call(core.create_namespaced_pod, ns, gpu_pod("gpu", {"app": "x"}))
    side.call(core.create_namespaced_pod, ns, pod("plain"))
    event_body = event("gpu.1", "gpu", ns, "FilteringFailed")
    event_body["involvedObject"]["uid"] = side.call(core.read_namespaced_pod, "gpu", ns).body["metadata"]["uid"]
    event_body["type"] = "Warning"
    side.call(core.create_namespaced_event, ns, event_body)
    table = side.call(core.read_namespaced_pod, "gpu", ns, _headers={"Accept": TABLE})
    events_table = side.call(core.list_namespaced_event, ns, _headers={"Accept": TABLE})
    return {
        "Table of one pod": table_view(table),
        "Table of events": table_view(events_table),
        "get pod": kubectl_view(side.kubectl("get", "pod", "gpu")),
        "get pods": kubectl_view(side.kubectl("get", "pods")),
        "get pods -l": kubectl_view(side.kubectl("get", "pods", "-l", "app=x")),
        "get pod -o wide": kubectl_view(side.kubectl("get", "pod", "gpu", "-o", "wide")),
        "get pod jsonpath": kubectl_view(
            side.kubectl("get", "pod", "gpu", "-o", "jsonpath={.spec.containers[0].resources.limits}")
        ),
        "describe pod": describe_view(side.kubectl("describe", "pod", "gpu").stdout),
        "get missing": kubectl_view(side.kubectl("get", "pod", "absent")),
    }


def errors(side: Side) -> View:
    core, ns = side.core, side.namespace
    side.call(core.create_namespaced_pod, ns, pod("p"))
    no_containers = pod("empty")
    no_containers["spec"]["containers"] = []
    return {
        "missing pod": status_view(side.call(core.read_namespaced_pod, "absent", ns)),
        "invalid name": status_view(side.call(core.create_namespaced_pod, ns, pod("Bad_Name")), message=True),
        "invalid label": status_view(
            side.call(core.create_namespaced_pod, ns, pod("l", {"bad key!": "v"})), message=True
        ),
        "invalid label value": status_view(
            side.call(core.create_namespaced_pod, ns, pod("l", {"k": "-v-"})), message=True
        ),
        "invalid namespace name": status_view(
            side.call(core.create_namespace, {"metadata": {"name": "Bad.Ns"}}), message=True
        ),
        "no containers": status_view(side.call(core.create_namespaced_pod, ns, no_containers), message=True),
        "already exists": status_view(side.call(core.create_namespaced_pod, ns, pod("p"))),
        "unknown field selector": status_view(
            side.call(core.list_namespaced_pod, ns, field_selector="spec.foo=bar"), message=True
        ),
        "namespace field on nodes": status_view(side.call(core.list_node, field_selector="metadata.namespace=x")),
        "bad label selector": status_view(side.call(core.list_namespaced_pod, ns, label_selector="a in (b")),
        "missing namespace": status_view(side.call(core.create_namespaced_pod, f"{ns}-absent", pod("p"))),
        "delete missing": status_view(side.call(core.delete_namespaced_pod, "absent", ns)),
        "missing node": status_view(side.call(core.read_node, f"absent-{ns}")),
    }


# --- mutating admission webhooks -----------------------------------------------------------------------------

SKIP: Final = "diff.hami.io/skip"


def hook_configuration(name: str, namespace: str, hook: HookServer, absent: str) -> Json:
    # only this test's namespace: the apiserver is shared by the session
    called = webhook(
        "mutate.diff.hami.io",
        f"{hook.url}/hook",
        hook.ca_bundle,
        "Fail",
        ["patch", "deny", "deny-code", "bad-patch"],
        namespace,
    )
    called["matchConditions"] = [
        {
            "name": "not-skipped",
            "expression": f"!(has(object.metadata.annotations) && '{SKIP}' in object.metadata.annotations)",
        }
    ]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            called,
            webhook("absent-ignore.diff.hami.io", f"{absent}/hook", hook.ca_bundle, "Ignore", ["patch"], namespace),
            webhook("absent-fail.diff.hami.io", f"{absent}/hook", hook.ca_bundle, "Fail", ["unreachable"], namespace),
        ],
    }


def wait_for_webhooks(side: Side) -> None:
    """kube-apiserver reads webhook configurations from an informer: the first creates after a change may
    miss it. Probe pods (not compared) are created until one comes back mutated."""
    deadline = time.monotonic() + 30
    for attempt in range(1000):
        probe = pod(f"probe-{attempt}", {"mode": "patch"})
        created = side.call(side.core.create_namespaced_pod, side.namespace, probe)
        side.call(side.core.delete_namespaced_pod, f"probe-{attempt}", side.namespace)
        if MUTATED in ((created.body or {}).get("metadata") or {}).get("annotations", {}):
            return
        assert time.monotonic() < deadline, f"{side.name}: the webhook configuration never took effect"
        time.sleep(0.2)


def review_view(review: Json) -> View:
    """The AdmissionReview as the webhook got it: what HAMi's webhook reads, normalised."""
    request = dict(review["request"])
    request["uid"] = "<uid>" if request.get("uid") else None
    # kube-apiserver adds the x509 credential's fingerprint as userInfo.extra; the emulator authenticates none
    request["userInfo"] = {k: v for k, v in request["userInfo"].items() if k != "extra"}
    request["object"] = normalise(request["object"], "Pod")
    return {"apiVersion": review.get("apiVersion"), "kind": review.get("kind"), "request": request}


def webhooks(side: Side) -> View:
    name = f"diff-{side.namespace}"
    with hook_server(side.home / "hook-ca") as hook:
        configuration = hook_configuration(name, side.namespace, hook, f"https://127.0.0.1:{closed_port()}")
        try:
            return webhook_calls(side, configuration, hook)
        finally:
            side.call(side.admission.delete_mutating_webhook_configuration, name)


def webhook_calls(side: Side, configuration: Json, hook: HookServer) -> View:
    core, ns, name = side.core, side.namespace, configuration["metadata"]["name"]
    registered = side.call(side.admission.create_mutating_webhook_configuration, configuration)
    for hook_object in registered.body.get("webhooks", []):
        hook_object["clientConfig"]["caBundle"] = "<a CA of this side>"
    view: View = {"register": object_view(registered)}
    wait_for_webhooks(side)
    hook.seen.clear()
    mutated = side.call(core.create_namespaced_pod, ns, gpu_pod("mutated", {"mode": "patch"}))
    view["mutated"] = (mutated.code, mutated.body["metadata"].get("annotations"), mutated.body["spec"]["schedulerName"])
    view["review"] = [(path.split("?")[1], review_view(review)) for path, review in hook.seen]
    generated = pod("", {"mode": "patch"})
    generated["metadata"] = {"generateName": "gen-", "labels": {"mode": "patch"}}
    hook.seen.clear()
    made = side.call(core.create_namespaced_pod, ns, generated)
    view["generateName"] = (made.code, made.body["metadata"]["name"].startswith("gen-"))
    view["generateName review"] = [
        {k: review["request"].get(k) for k in ("name", "namespace", "operation")} for _, review in hook.seen
    ]
    for mode in ("deny", "deny-code", "bad-patch", "unreachable"):
        refused = side.call(core.create_namespaced_pod, ns, pod(mode, {"mode": mode}))
        view[mode] = status_view(refused, message=True)
    skipped = pod("skipped", {"mode": "deny"})
    skipped["metadata"]["annotations"] = {SKIP: "yes"}
    view["matchConditions false"] = side.call(core.create_namespaced_pod, ns, skipped).code
    view["kubectl get"] = kubectl_view(side.kubectl("get", "mutatingwebhookconfiguration", name))
    manifest = side.home / "denied.json"
    manifest.write_text(json.dumps(pod("denied-by-kubectl", {"mode": "deny"})))
    done = side.kubectl("create", "-f", str(manifest))
    view["kubectl create denied"] = (done.returncode, done.stderr.replace(str(manifest), "<file>").strip())
    return view


def known_differences(side: Side) -> View:
    """What the emulator does differently on purpose; every key here has its entry in KNOWN."""
    core, ns = side.core, side.namespace
    side.call(core.create_namespaced_pod, ns, pod("bound"))
    target = {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1"}
    side.call(core.create_namespaced_binding, ns, {"metadata": {"name": "bound"}, "target": target})
    deleted = side.call(core.delete_namespaced_pod, "bound", ns)
    view: View = {
        "delete bound pod": (deleted.code, deleted.body["metadata"].get("deletionGracePeriodSeconds")),
        "bound pod after delete": side.call(core.read_namespaced_pod, "bound", ns).code,
        "dryRun create": side.call(core.create_namespaced_pod, ns, pod("dry"), dry_run="All").code,
    }
    applied = side.call(
        core.patch_namespaced_pod,
        "applied",
        ns,
        pod("applied"),
        field_manager="diff",
        _content_type="application/apply-patch+yaml",
    )
    view["server-side apply"] = applied.code
    gone = f"{ns}-gone"
    side.call(core.create_namespace, {"metadata": {"name": gone}})
    removed = side.call(core.delete_namespace, gone)
    view["delete namespace"] = (removed.code, (removed.body.get("status") or {}).get("phase"))
    view["namespace after delete"] = side.call(core.read_namespace, gone).code
    return view


SCENARIOS: Final = {
    "pods: create, get, list, label and field selectors, pages": pods_get_list_select,
    "pods: merge, JSON and strategic merge patches of annotations": pod_annotation_patches,
    "pods: guarded annotation patches (test operations)": guarded_annotation_patches,
    "pods: a stale resourceVersion is 409 Conflict": stale_resource_version,
    "pods/binding: once 201, again 409": binding,
    "pods/status: status patches, READY column": pod_status,
    "nodes: create, status patch, cordon, kubectl": nodes,
    "events: create, field selectors, kubectl get events": events,
    "leases: create, update, conflict": leases,
    "create: what is kept of a status sent": create_with_status,
    "watch: ADDED, MODIFIED, DELETED for one pod": watch_one_pod,
    "kubectl: get pod, get pods, -o wide, describe": kubectl_pods,
    "errors: 404, 422, 400, 409": errors,
    "webhooks: mutating admission on pod create": webhooks,
    "known differences": known_differences,
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_emulator_agrees_with_kube_apiserver(scenario: str, sides: list[Side]) -> None:
    real, emulated = (SCENARIOS[scenario](side) for side in sides)
    compare(scenario, real, emulated)
