"""Server-side printing: the ``meta.k8s.io/v1 Table`` that ``kubectl get`` asks for."""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable
from typing import Any, Final

from hami_sim.kubeapi._resources import ResourceType

__all__ = ["TABLE_ACCEPT", "to_table", "wants_table"]

JsonObj = dict[str, Any]
TABLE_ACCEPT: Final = "as=Table"

Column = tuple[str, str, int]  # name, type, priority (1: only with -o wide)


def wants_table(accept: str) -> bool:
    first = accept.split(",")[0]
    return TABLE_ACCEPT in first


def _age(obj: JsonObj, now: float) -> str:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return "<unknown>"
    try:
        created = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return "<unknown>"
    seconds = max(0, int(now - created))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * 2:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _name(obj: JsonObj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _pod_cells(obj: JsonObj, now: float) -> list[Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    containers = spec.get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if isinstance(s, dict) and s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses if isinstance(s, dict))
    phase = status.get("phase") or "Pending"
    if (obj.get("metadata") or {}).get("deletionTimestamp"):
        phase = "Terminating"
    return [
        _name(obj),
        f"{ready}/{len(containers)}",
        phase,
        restarts,
        _age(obj, now),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        "<none>",
    ]


def _node_cells(obj: JsonObj, now: float) -> list[Any]:
    status = obj.get("status") or {}
    ready = next(
        (c.get("status") for c in status.get("conditions") or [] if isinstance(c, dict) and c.get("type") == "Ready"),
        None,
    )
    state = "Ready" if ready == "True" else "NotReady" if ready == "False" else "Unknown"
    if (obj.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = (obj.get("metadata") or {}).get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    version = (status.get("nodeInfo") or {}).get("kubeletVersion", "")
    return [_name(obj), state, ",".join(roles) or "<none>", _age(obj, now), version]


_POD_COLUMNS: Final[tuple[Column, ...]] = (
    ("Name", "string", 0),
    ("Ready", "string", 0),
    ("Status", "string", 0),
    ("Restarts", "string", 0),
    ("Age", "string", 0),
    ("IP", "string", 1),
    ("Node", "string", 1),
    ("Nominated Node", "string", 1),
    ("Readiness Gates", "string", 1),
)
_NODE_COLUMNS: Final[tuple[Column, ...]] = (
    ("Name", "string", 0),
    ("Status", "string", 0),
    ("Roles", "string", 0),
    ("Age", "string", 0),
    ("Version", "string", 0),
)
_GENERIC_COLUMNS: Final[tuple[Column, ...]] = (("Name", "string", 0), ("Age", "string", 0))


def _generic_cells(obj: JsonObj, now: float) -> list[Any]:
    return [_name(obj), _age(obj, now)]


def _printer(rt: ResourceType) -> tuple[tuple[Column, ...], Callable[[JsonObj, float], list[Any]]]:
    if rt.plural == "pods":
        return _POD_COLUMNS, _pod_cells
    if rt.plural == "nodes":
        return _NODE_COLUMNS, _node_cells
    return _GENERIC_COLUMNS, _generic_cells


def _partial(obj: JsonObj) -> JsonObj:
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata") or {},
    }


def to_table(rt: ResourceType, items: list[JsonObj], rv: str, include_object: str, *, headers: bool = True) -> JsonObj:
    columns, cells = _printer(rt)
    now = time.time()
    rows = []
    for obj in items:
        row: JsonObj = {"cells": cells(obj, now)}
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
