"""Server-side printing: the ``meta.k8s.io/v1 Table`` that ``kubectl get`` asks for.

The columns and cells are kube-apiserver's (its printers for pods, nodes, events, leases, namespaces,
resource quotas and webhook configurations): the server always prints the wide columns and kubectl hides
those of priority 1 unless ``-o wide``. Column descriptions are left empty (kubectl never prints them).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any, Final

from hami_sim.kubeapi._resources import ResourceType

__all__ = ["TABLE_ACCEPT", "human_duration", "to_table", "wants_table"]

JsonObj = dict[str, Any]
TABLE_ACCEPT: Final = "as=Table"
UNKNOWN: Final = "<unknown>"
NONE: Final = "<none>"

Column = tuple[str, str, int]  # name, type, priority (1: only with -o wide)
Cells = Callable[[JsonObj, float], list[Any]]


def wants_table(accept: str) -> bool:
    first = accept.split(",")[0]
    return TABLE_ACCEPT in first


def human_duration(seconds: float) -> str:
    """How long ago, in kubectl's words (apimachinery's ``duration.HumanDuration``)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes, hours = s // 60, s // 3600
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if hours < 24 * 365 * 2:
        return f"{days}d"
    years = days // 365
    if hours < 24 * 365 * 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def _epoch(stamp: object) -> float | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _since(stamp: object, now: float) -> str:
    at = _epoch(stamp)
    return UNKNOWN if at is None else human_duration(now - at)


def _age(obj: JsonObj, now: float) -> str:
    return _since(_meta(obj).get("creationTimestamp"), now)


def _meta(obj: JsonObj) -> JsonObj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _part(obj: JsonObj, key: str) -> JsonObj:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _dicts(value: object) -> list[JsonObj]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _name(obj: JsonObj) -> str:
    return str(_meta(obj).get("name", ""))


# --- pods ----------------------------------------------------------------------------------------------------


def _terminated_reason(terminated: JsonObj, prefix: str = "") -> str:
    if terminated.get("reason"):
        return prefix + str(terminated["reason"])
    if terminated.get("signal"):
        return f"{prefix}Signal:{terminated['signal']}"
    return f"{prefix}ExitCode:{terminated.get('exitCode', 0)}"


def _restartable(container: JsonObj | None) -> bool:
    return container is not None and container.get("restartPolicy") == "Always"


def _has_condition(status: JsonObj, kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in _dicts(status.get("conditions")))


def _last_restart(statuses: list[JsonObj]) -> float | None:
    finished = [_epoch(_part(_part(s, "lastState"), "terminated").get("finishedAt")) for s in statuses]
    stamps = [f for f in finished if f is not None]
    return max(stamps) if stamps else None


class _PodState:
    """What ``printPod`` works out of a pod's status: readiness, the STATUS reason, restarts."""

    def __init__(self, pod: JsonObj) -> None:
        spec, status = _part(pod, "spec"), _part(pod, "status")
        self.spec, self.status = spec, status
        inits = {str(c.get("name")): c for c in _dicts(spec.get("initContainers"))}
        self.inits = inits
        self.total = len(_dicts(spec.get("containers"))) + sum(1 for c in inits.values() if _restartable(c))
        self.ready = 0
        self.restarts = 0
        self.restarted: list[JsonObj] = []
        self.reason = str(status.get("reason") or status.get("phase") or "")
        if any(
            c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated"
            for c in _dicts(status.get("conditions"))
        ):
            self.reason = "SchedulingGated"
        initializing = self._init_containers()
        if not initializing or _has_condition_set(status, "Initialized"):
            self._containers()
        meta = _meta(pod)
        if meta.get("deletionTimestamp"):
            if status.get("reason") == "NodeLost":
                self.reason = "Unknown"
            elif status.get("phase") not in ("Succeeded", "Failed"):
                self.reason = "Terminating"

    def _init_containers(self) -> bool:
        statuses = _dicts(self.status.get("initContainerStatuses"))
        self.restarted = statuses
        for i, container in enumerate(statuses):
            self.restarts += int(container.get("restartCount") or 0)
            state = _part(container, "state")
            terminated, waiting = _part(state, "terminated"), _part(state, "waiting")
            restartable = _restartable(self.inits.get(str(container.get("name"))))
            if "terminated" in state and terminated.get("exitCode", 0) == 0:
                continue
            if restartable and container.get("started"):
                self.ready += 1 if container.get("ready") else 0
                continue
            if "terminated" in state:
                self.reason = _terminated_reason(terminated, "Init:")
            elif waiting.get("reason") and waiting["reason"] != "PodInitializing":
                self.reason = f"Init:{waiting['reason']}"
            else:
                self.reason = f"Init:{i}/{len(_dicts(self.spec.get('initContainers')))}"
            return True
        return False

    def _containers(self) -> None:
        restartable = [
            s
            for s in _dicts(self.status.get("initContainerStatuses"))
            if _restartable(self.inits.get(str(s.get("name"))))
        ]
        statuses = _dicts(self.status.get("containerStatuses"))
        self.restarts = sum(int(s.get("restartCount") or 0) for s in restartable)
        self.restarted = restartable + statuses
        running, error = False, ""
        for container in reversed(statuses):
            self.restarts += int(container.get("restartCount") or 0)
            state = _part(container, "state")
            waiting, terminated = _part(state, "waiting"), _part(state, "terminated")
            if waiting.get("reason"):
                self.reason = str(waiting["reason"])
            elif "terminated" in state:
                self.reason = _terminated_reason(terminated)
                if terminated.get("exitCode", 0) != 0:
                    error = self.reason
            elif container.get("ready") and "running" in state:
                running = True
                self.ready += 1
        if self.reason == "Completed":
            if running and _has_condition(self.status, "Ready"):
                self.reason = "Running"
            elif error:
                self.reason = error
            elif running:
                self.reason = "NotReady"

    def restarts_cell(self, now: float) -> str:
        last = _last_restart(self.restarted) if self.restarts else None
        return f"{self.restarts} ({human_duration(now - last)} ago)" if last is not None else str(self.restarts)


def _has_condition_set(status: JsonObj, kind: str) -> bool:
    return next((c.get("status") == "True" for c in _dicts(status.get("conditions")) if c.get("type") == kind), False)


def _pod_ip(status: JsonObj) -> str:
    ips = _dicts(status.get("podIPs"))
    return str(ips[0].get("ip") or NONE) if ips else str(status.get("podIP") or NONE)


def _readiness_gates(spec: JsonObj, status: JsonObj) -> str:
    gates = _dicts(spec.get("readinessGates"))
    if not gates:
        return NONE
    conditions = {str(c.get("type")): c.get("status") for c in reversed(_dicts(status.get("conditions")))}
    ready = sum(1 for g in gates if conditions.get(str(g.get("conditionType"))) == "True")
    return f"{ready}/{len(gates)}"


def _pod_cells(obj: JsonObj, now: float) -> list[Any]:
    state = _PodState(obj)
    spec, status = state.spec, state.status
    return [
        _name(obj),
        f"{state.ready}/{state.total}",
        state.reason,
        state.restarts_cell(now),
        _age(obj, now),
        _pod_ip(status),
        spec.get("nodeName") or NONE,
        status.get("nominatedNodeName") or NONE,
        _readiness_gates(spec, status),
    ]


def _pod_conditions(obj: JsonObj) -> list[JsonObj] | None:
    phase = _part(obj, "status").get("phase")
    if phase == "Succeeded":
        message = "The pod has completed successfully."
    elif phase == "Failed":
        message = "The pod failed."
    else:
        return None
    return [{"type": "Completed", "status": "True", "reason": phase, "message": message}]


# --- other kinds ---------------------------------------------------------------------------------------------


def _node_cells(obj: JsonObj, now: float) -> list[Any]:
    status, spec = _part(obj, "status"), _part(obj, "spec")
    ready = {str(c.get("type")): c for c in _dicts(status.get("conditions"))}.get("Ready")
    states = ["Unknown"] if ready is None else ["Ready" if ready.get("status") == "True" else "NotReady"]
    if spec.get("unschedulable"):
        states.append("SchedulingDisabled")
    labels = _meta(obj).get("labels") or {}
    roles = {k.removeprefix("node-role.kubernetes.io/") for k in labels if k.startswith("node-role.kubernetes.io/")}
    roles.discard("")
    if labels.get("kubernetes.io/role"):
        roles.add(str(labels["kubernetes.io/role"]))
    info = _part(status, "nodeInfo")
    kernel = str(info.get("kernelVersion") or UNKNOWN)
    if info.get("architecture"):
        kernel += f" ({info['architecture']})"
    addresses = {str(a.get("type")): str(a.get("address")) for a in reversed(_dicts(status.get("addresses")))}
    return [
        _name(obj),
        ",".join(states),
        ",".join(sorted(roles)) or NONE,
        _age(obj, now),
        str(info.get("kubeletVersion") or ""),
        addresses.get("InternalIP", NONE),
        addresses.get("ExternalIP", NONE),
        str(info.get("osImage") or UNKNOWN),
        kernel,
        str(info.get("containerRuntimeVersion") or UNKNOWN),
    ]


def _first(*values: object) -> str:
    return next((str(v) for v in values if v), "")


def _event_cells(obj: JsonObj, now: float) -> list[Any]:
    first = _since(obj.get("firstTimestamp"), now)
    if _epoch(obj.get("firstTimestamp")) is None:
        first = _since(obj.get("eventTime"), now)
    last = first if _epoch(obj.get("lastTimestamp")) is None else _since(obj.get("lastTimestamp"), now)
    count = int(obj.get("count") or 0)
    series = obj.get("series")
    if isinstance(series, dict):
        last, count = _since(series.get("lastObservedTime"), now), int(series.get("count") or 0)
    elif count == 0:
        count = 1
    involved, source = _part(obj, "involvedObject"), _part(obj, "source")
    kind = str(involved.get("kind") or "").lower()
    target = f"{kind}/{involved['name']}" if involved.get("name") else kind
    component = _first(source.get("component"), obj.get("reportingComponent"))
    instance = _first(source.get("host"), obj.get("reportingInstance"))
    return [
        last,
        str(obj.get("type") or ""),
        str(obj.get("reason") or ""),
        target,
        str(involved.get("fieldPath") or ""),
        f"{component}, {instance}" if instance else component,
        str(obj.get("message") or "").strip(),
        first,
        count,
        _name(obj),
    ]


def _lease_cells(obj: JsonObj, now: float) -> list[Any]:
    return [_name(obj), str(_part(obj, "spec").get("holderIdentity") or ""), _age(obj, now)]


def _namespace_cells(obj: JsonObj, now: float) -> list[Any]:
    return [_name(obj), str(_part(obj, "status").get("phase") or ""), _age(obj, now)]


def _quota_cells(obj: JsonObj, now: float) -> list[Any]:
    status = _part(obj, "status")
    hard, used = _part(status, "hard"), _part(status, "used")
    requests: list[str] = []
    limits: list[str] = []
    for resource in sorted(hard):
        column = limits if resource.split(".")[0] == "limits" and "." in resource else requests
        column.append(f"{resource}: {used.get(resource, '0')}/{hard[resource]}")
    return [_name(obj), ", ".join(requests), ", ".join(limits), _age(obj, now)]


def _webhook_config_cells(obj: JsonObj, now: float) -> list[Any]:
    return [_name(obj), len(_dicts(obj.get("webhooks"))), _age(obj, now)]


def _generic_cells(obj: JsonObj, now: float) -> list[Any]:
    return [_name(obj), _age(obj, now)]


_NAME: Final[Column] = ("Name", "string", 0)
_AGE: Final[Column] = ("Age", "string", 0)
_PRINTERS: Final[dict[str, tuple[tuple[Column, ...], Cells]]] = {
    "pods": (
        (
            _NAME,
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "string", 0),
            _AGE,
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ),
        _pod_cells,
    ),
    "nodes": (
        (
            _NAME,
            ("Status", "string", 0),
            ("Roles", "string", 0),
            _AGE,
            ("Version", "string", 0),
            ("Internal-IP", "string", 1),
            ("External-IP", "string", 1),
            ("OS-Image", "string", 1),
            ("Kernel-Version", "string", 1),
            ("Container-Runtime", "string", 1),
        ),
        _node_cells,
    ),
    "events": (
        (
            ("Last Seen", "string", 0),
            ("Type", "string", 0),
            ("Reason", "string", 0),
            ("Object", "string", 0),
            ("Subobject", "string", 1),
            ("Source", "string", 1),
            ("Message", "string", 0),
            ("First Seen", "string", 1),
            ("Count", "string", 1),
            ("Name", "string", 1),
        ),
        _event_cells,
    ),
    "leases": ((_NAME, ("Holder", "string", 0), _AGE), _lease_cells),
    "namespaces": ((_NAME, ("Status", "string", 0), _AGE), _namespace_cells),
    "resourcequotas": ((_NAME, ("Request", "string", 0), ("Limit", "string", 0), _AGE), _quota_cells),
    "mutatingwebhookconfigurations": ((_NAME, ("Webhooks", "integer", 0), _AGE), _webhook_config_cells),
}


def _printer(rt: ResourceType) -> tuple[tuple[Column, ...], Cells]:
    return _PRINTERS.get(rt.plural, ((_NAME, _AGE), _generic_cells))


def _partial(obj: JsonObj) -> JsonObj:
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": _meta(obj)}


def to_table(rt: ResourceType, items: list[JsonObj], rv: str, include_object: str, *, headers: bool = True) -> JsonObj:
    columns, cells = _printer(rt)
    now = time.time()
    rows = []
    for obj in items:
        row: JsonObj = {"cells": cells(obj, now)}
        conditions = _pod_conditions(obj) if rt.plural == "pods" else None
        if conditions:
            row["conditions"] = conditions
        if include_object != "None":
            row["object"] = obj if include_object == "Object" else _partial(obj)
        rows.append(row)
    table: JsonObj = {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "rows": rows,
    }
    if headers:
        table["columnDefinitions"] = [
            {"name": n, "type": t, "format": "name" if n == "Name" else "", "description": "", "priority": p}
            for n, t, p in columns
        ]
    return table
