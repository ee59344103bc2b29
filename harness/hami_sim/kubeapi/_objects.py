"""Pure rules for stored objects: shape checks, validation, defaults, and what an update may change."""

from __future__ import annotations

import copy
import datetime
import re
import secrets
from typing import Any, Final

from hami_sim.kubeapi._errors import ApiError, bad_request, invalid
from hami_sim.kubeapi._resources import ResourceType

__all__ = [
    "NAMESPACE_NAME_LABEL",
    "admission_view",
    "check_shape",
    "decode_defaults",
    "generate_name",
    "normalize_quantities",
    "pod_spec_change",
    "prepare_create",
    "validate",
]

JsonObj = dict[str, Any]

_DNS_SUBDOMAIN: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE: Final = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME: Final = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
_NAME_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"
# Pod spec fields an update may change (upstream: "pod updates may not change fields other than ...").
_POD_MUTABLE: Final = (
    "activeDeadlineSeconds",
    "tolerations",
    "schedulingGates",
    "terminationGracePeriodSeconds",
)


def check_shape(obj: object, what: str = "object", *, patch: bool = False) -> JsonObj:
    """The decoding errors a Go apiserver reports as 400: wrong JSON types in the fields we read.
    In a ``patch``, ``null`` values are allowed (they delete)."""
    if not isinstance(obj, dict):
        raise bad_request(f"{what} must be a JSON object")
    metadata = obj.get("metadata", {})
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise bad_request("metadata must be an object")
    for field in ("name", "namespace", "generateName", "resourceVersion", "uid"):
        if field in metadata and not isinstance(metadata[field], str | None):
            raise bad_request(f"metadata.{field} must be a string")
    for field in ("labels", "annotations"):
        value = metadata.get(field)
        if value is None:
            continue
        allowed = (str, type(None)) if patch else (str,)
        if not isinstance(value, dict) or not all(isinstance(v, allowed) for v in value.values()):
            raise bad_request(f"metadata.{field} must be a map of strings")
    for field in ("spec", "status"):
        if obj.get(field) is not None and not isinstance(obj[field], dict):
            raise bad_request(f"{field} must be an object")
    return obj


def _quantity(value: object, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{where}: quantities must be strings or numbers")
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def _normalize_map(holder: object, field: str, where: str) -> None:
    if not isinstance(holder, dict) or holder.get(field) is None:
        return
    values = holder[field]
    if not isinstance(values, dict):
        raise bad_request(f"{where}.{field} must be a map of quantities")
    holder[field] = {k: _quantity(v, f"{where}.{field}[{k}]") for k, v in values.items()}


def normalize_quantities(rt: ResourceType, obj: JsonObj) -> None:
    """Store quantities as strings, as an apiserver does (YAML ``nvidia.com/gpu: 1`` arrives as a number)."""
    spec, status = obj.get("spec"), obj.get("status")
    if rt.plural == "pods" and isinstance(spec, dict):
        for group in ("containers", "initContainers"):
            for i, container in enumerate(spec.get(group) or []):
                resources = container.get("resources") if isinstance(container, dict) else None
                for field in ("limits", "requests"):
                    _normalize_map(resources, field, f"spec.{group}[{i}].resources")
    elif rt.plural == "nodes":
        for field in ("capacity", "allocatable"):
            _normalize_map(status, field, "status")
    elif rt.plural == "resourcequotas":
        _normalize_map(spec, "hard", "spec")
        for field in ("hard", "used"):
            _normalize_map(status, field, "status")


def generate_name(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_NAME_ALPHABET) for _ in range(5))


_SUBDOMAIN_RULE: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_RULE: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_NAME_PART_RULE: Final = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_LABEL_VALUE_RULE: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used "
    "for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)


def _name_errors(rt: ResourceType, name: str) -> list[str]:
    if rt.plural == "namespaces":
        errors = [] if _DNS_LABEL.match(name) else [_LABEL_RULE]
        return errors + (["must be no more than 63 characters"] if len(name) > 63 else [])
    errors = [] if _DNS_SUBDOMAIN.match(name) else [_SUBDOMAIN_RULE]
    return errors + (["must be no more than 253 characters"] if len(name) > 253 else [])


def _qualified_name_errors(key: str) -> list[str]:
    """kube-apiserver's words for a label or annotation key that is not a qualified name."""
    prefix, slash, name = key.rpartition("/")
    errors = []
    if slash and not prefix:
        errors.append("prefix part must be non-empty")
    elif prefix and not _DNS_SUBDOMAIN.match(prefix):
        errors.append(f"prefix part {_SUBDOMAIN_RULE}")
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if name and not _QUALIFIED_NAME.match(name):
        errors.append(_NAME_PART_RULE)
    return errors


def _label_value_errors(value: str) -> list[str]:
    errors = ["must be no more than 63 characters"] if len(value) > 63 else []
    return errors + ([] if _LABEL_VALUE.match(value) else [_LABEL_VALUE_RULE])


def _validate_metadata(rt: ResourceType, name: str, metadata: JsonObj) -> list[tuple[str, str]]:
    causes: list[tuple[str, str]] = []
    if not name:
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    causes += [("metadata.name", f'Invalid value: "{name}": {e}') for e in _name_errors(rt, name) if name]
    for key, value in (metadata.get("labels") or {}).items():
        causes += [("metadata.labels", f'Invalid value: "{key}": {e}') for e in _qualified_name_errors(key)]
        causes += [("metadata.labels", f'Invalid value: "{value}": {e}') for e in _label_value_errors(value)]
    for key in metadata.get("annotations") or {}:
        causes += [("metadata.annotations", f'Invalid value: "{key}": {e}') for e in _qualified_name_errors(key)]
    return causes


def _validate_pod(obj: JsonObj) -> list[tuple[str, str]]:
    spec = obj.get("spec") or {}
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return [("spec.containers", "Required value")]
    causes = []
    for i, container in enumerate(containers):
        if not isinstance(container, dict) or not container.get("name"):
            causes.append((f"spec.containers[{i}].name", "Required value"))
        elif not container.get("image"):
            causes.append((f"spec.containers[{i}].image", "Required value"))
    return causes


def _validate_webhook(i: int, hook: object, seen: set[str]) -> list[tuple[str, str]]:
    where = f"webhooks[{i}]"
    if not isinstance(hook, dict):
        return [(where, "Invalid value: must be an object")]
    causes = []
    name = hook.get("name")
    if not isinstance(name, str) or not _DNS_SUBDOMAIN.match(name) or name.count(".") < 2:
        causes.append((f"{where}.name", f'Invalid value: "{name}": should be a domain with at least three segments'))
    elif name in seen:
        causes.append((f"{where}.name", f'Duplicate value: "{name}"'))
    seen.add(str(name))
    if hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
        causes.append((f"{where}.sideEffects", "Required value: must specify one of None, NoneOnDryRun"))
    if not hook.get("admissionReviewVersions"):
        causes.append((f"{where}.admissionReviewVersions", "Required value: must specify one of v1, v1beta1"))
    client = hook.get("clientConfig")
    if not isinstance(client, dict) or bool(client.get("url")) == bool(client.get("service")):
        causes.append((f"{where}.clientConfig", "Required value: exactly one of url or service is required"))
    elif client.get("url") and not str(client["url"]).startswith("https://"):
        causes.append((f"{where}.clientConfig.url", "Invalid value: 'https' is the only allowed URL scheme"))
    return causes


def _validate_event(obj: JsonObj) -> list[tuple[str, str]]:
    """The legacy core/v1 rules: the involved object's namespace agrees with the event's (an object
    without one, a Node, may only have events in ``default``; with ``eventTime`` in ``kube-system`` too)."""
    namespace = (obj.get("metadata") or {}).get("namespace") or ""
    involved = obj.get("involvedObject") or {}
    theirs = (involved.get("namespace") or "") if isinstance(involved, dict) else ""
    if obj.get("eventTime"):  # a "new" event: only an object without a namespace is checked
        wrong = not theirs and namespace not in ("", "default", "kube-system")
    else:
        wrong = theirs != namespace if theirs else namespace not in ("", "default")
    if wrong:
        return [("involvedObject.namespace", f'Invalid value: "{theirs}": does not match event.namespace')]
    return []


def _validate_webhooks(obj: JsonObj) -> list[tuple[str, str]]:
    hooks = obj.get("webhooks") or []
    if not isinstance(hooks, list):
        return [("webhooks", "Invalid value: must be a list")]
    seen: set[str] = set()
    return [cause for i, hook in enumerate(hooks) for cause in _validate_webhook(i, hook, seen)]


def validate(rt: ResourceType, obj: JsonObj) -> None:
    metadata = obj.get("metadata") or {}
    name = metadata.get("name") or ""
    causes = _validate_metadata(rt, name, metadata)
    if rt.plural == "pods":
        causes += _validate_pod(obj)
    elif rt.plural == "mutatingwebhookconfigurations":
        causes += _validate_webhooks(obj)
    elif rt.plural == "events":
        causes += _validate_event(obj)
    if causes:
        raise invalid(rt, name, causes)


def _decoded(rt: ResourceType, obj: object, namespace: str | None) -> JsonObj:
    """The request body as the apiserver holds it once decoded: kind and namespace checked and set."""
    body = check_shape(obj)
    kind, api_version = body.get("kind"), body.get("apiVersion")
    if (kind and kind != rt.kind) or (api_version and api_version != rt.api_version):
        raise bad_request(f"the object kind {api_version}/{kind} does not match {rt.api_version}/{rt.kind}")
    result = copy.deepcopy(body)
    metadata = dict(result.get("metadata") or {})
    body_ns = metadata.get("namespace")
    if namespace is not None and body_ns and body_ns != namespace:
        raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
    if namespace is not None:
        metadata["namespace"] = namespace
    else:
        metadata.pop("namespace", None)
    result["metadata"] = metadata
    result["kind"] = rt.kind
    result["apiVersion"] = rt.api_version
    return result


def admission_view(rt: ResourceType, obj: object, namespace: str | None) -> JsonObj:
    """The object mutating admission webhooks are sent on create: decoded and defaulted, not yet named
    from ``generateName`` nor given a uid (kube-apiserver admits before it stores)."""
    result = _decoded(rt, obj, namespace if rt.namespaced else None)
    decode_defaults(rt, result)
    _default(rt, result)
    if rt.plural == "pods":  # a pod's status is reset when it is stored, after admission
        result.setdefault("status", {})
    return result


def prepare_create(rt: ResourceType, obj: JsonObj, namespace: str | None, now: str, uid: str) -> JsonObj:
    """The object as stored on create: identity, timestamps and defaults filled in, system fields reset."""
    result = _decoded(rt, obj, namespace)
    metadata = result["metadata"]
    if not metadata.get("name") and metadata.get("generateName"):
        metadata["name"] = generate_name(metadata["generateName"])
    for field in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
        metadata.pop(field, None)
    metadata["uid"] = uid
    metadata["creationTimestamp"] = now
    decode_defaults(rt, result)
    validate(rt, result)
    _default(rt, result)
    _initial_status(rt, result)
    return result


def _default_requests(spec: JsonObj) -> None:
    """A container's requests default to its limits, resource by resource (upstream's pod defaulting)."""
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or []:
            resources = container.get("resources") if isinstance(container, dict) else None
            limits = resources.get("limits") if isinstance(resources, dict) else None
            if isinstance(resources, dict) and isinstance(limits, dict) and limits:
                requests = resources.get("requests")
                resources["requests"] = {**limits, **(requests if isinstance(requests, dict) else {})}


def _default(rt: ResourceType, obj: JsonObj) -> None:
    """The defaults of the spec, filled in as the request is decoded (before admission)."""
    if rt.plural == "pods":
        spec = obj.setdefault("spec", {})
        _default_requests(spec)
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("terminationGracePeriodSeconds", 30)
    elif rt.plural == "namespaces":
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    elif rt.plural in ("nodes", "resourcequotas"):
        obj.setdefault("spec", {})


_GATED: Final = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "SchedulingGated",
    "message": "Scheduling is blocked due to non-empty scheduling gates",
}


def _initial_status(rt: ResourceType, obj: JsonObj) -> None:
    """What a create keeps of the status it was sent, as upstream's create strategies: nothing for a pod
    (Pending, SchedulingGated when it has gates), a namespace (Active) or a quota (its controller fills it);
    all of it for a node (a kubelet registers its node with its status)."""
    if rt.plural == "pods":
        obj["status"] = {"phase": "Pending"}
        if (obj.get("spec") or {}).get("schedulingGates"):
            now = (obj.get("metadata") or {}).get("creationTimestamp")
            obj["status"]["conditions"] = [{**_GATED, "lastProbeTime": None, "lastTransitionTime": now}]
    elif rt.plural == "namespaces":
        obj["status"] = {"phase": "Active"}
    elif rt.plural == "resourcequotas":
        obj["status"] = {}
    elif rt.plural == "nodes":
        obj.setdefault("status", {})


_TIME_FIELDS: Final = frozenset(
    {
        "creationTimestamp",
        "deletionTimestamp",
        "lastProbeTime",
        "lastTransitionTime",
        "lastHeartbeatTime",
        "startTime",
        "startedAt",
        "finishedAt",
        "firstTimestamp",
        "lastTimestamp",
    }
)
_MICRO_TIME_FIELDS: Final = frozenset({"eventTime", "lastObservedTime", "acquireTime", "renewTime"})
_RFC3339: Final = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")
_RFC3339_MICRO: Final = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d{6})(Z|[+-]\d\d:\d\d)$")
_OMIT_EMPTY: Final = ("labels", "annotations", "finalizers", "ownerReferences")


def _time(rt: ResourceType, value: str, micro: bool) -> str:
    """A ``metav1.Time`` (RFC 3339, stored to the second in UTC) or ``MicroTime`` (exactly six fractional
    digits in, six out), as Go decodes and encodes them; anything else is the decoder's 400."""
    match = (_RFC3339_MICRO if micro else _RFC3339).match(value)
    parsed = None
    if match:
        zone = "+00:00" if match.group(3) == "Z" else match.group(3)
        try:
            parsed = datetime.datetime.fromisoformat(match.group(1) + (match.group(2) or "") + zone)
        except ValueError:
            parsed = None
    if parsed is None:
        layout = "2006-01-02T15:04:05.000000Z07:00" if micro else "2006-01-02T15:04:05Z07:00"
        raise bad_request(
            f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: '
            f'parsing time "{value}" as "{layout}": cannot parse'
        )
    utc = parsed.astimezone(datetime.UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def _normalize_times(rt: ResourceType, node: object) -> None:
    if isinstance(node, list):
        for item in node:
            _normalize_times(rt, item)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if isinstance(value, str) and (key in _TIME_FIELDS or key in _MICRO_TIME_FIELDS):
            node[key] = _time(rt, value, key in _MICRO_TIME_FIELDS)
        elif isinstance(value, dict | list) and key != "managedFields":
            _normalize_times(rt, value)


def decode_defaults(rt: ResourceType, obj: JsonObj) -> None:
    """What decoding does to every write, create or update: quantities as strings, timestamps in Go's
    form, empty metadata maps and lists dropped (``omitempty``), the defaults of webhook configurations,
    a node's allocatable (its capacity), and the ``kubernetes.io/metadata.name`` label of namespaces."""
    normalize_quantities(rt, obj)
    for key in ("spec", "status", "metadata", "involvedObject", "series"):
        _normalize_times(rt, obj.get(key))
    for key in ("firstTimestamp", "lastTimestamp", "eventTime"):
        if isinstance(obj.get(key), str):
            obj[key] = _time(rt, obj[key], key == "eventTime")
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        for key in _OMIT_EMPTY:
            if key in metadata and not metadata[key]:
                del metadata[key]
    if rt.plural == "namespaces":
        metadata = obj.setdefault("metadata", {})
        name = metadata.get("name")
        if name:
            metadata["labels"] = {**(metadata.get("labels") or {}), NAMESPACE_NAME_LABEL: name}
    elif rt.plural == "mutatingwebhookconfigurations":
        for hook in obj.get("webhooks") or []:
            if isinstance(hook, dict):
                _default_webhook(hook)
    elif rt.plural == "nodes":
        status = obj.get("status")
        if isinstance(status, dict) and status.get("capacity") and status.get("allocatable") is None:
            status["allocatable"] = dict(status["capacity"])  # allocatable defaults to capacity


def _default_webhook(hook: JsonObj) -> None:
    """kube-apiserver's defaults for a ``MutatingWebhook`` (admissionregistration/v1)."""
    for key, value in (
        ("failurePolicy", "Fail"),
        ("matchPolicy", "Equivalent"),
        ("timeoutSeconds", 10),
        ("reinvocationPolicy", "Never"),
    ):
        hook.setdefault(key, value)
    for key in ("namespaceSelector", "objectSelector"):
        if hook.get(key) is None:
            hook[key] = {}
    for rule in hook.get("rules") or []:
        if isinstance(rule, dict):
            rule.setdefault("scope", "*")
    service = (hook.get("clientConfig") or {}).get("service")
    if isinstance(service, dict):
        service.setdefault("port", 443)


def _comparable_pod_spec(spec: JsonObj) -> JsonObj:
    result = {k: v for k, v in spec.items() if k not in _POD_MUTABLE}
    for field in ("containers", "initContainers"):
        items = result.get(field)
        if isinstance(items, list):
            result[field] = [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in items]
    return result


def pod_spec_change(rt: ResourceType, name: str, old: JsonObj, new: JsonObj) -> None:
    """Raise 422 when an update changes a pod spec field upstream treats as immutable (``nodeName``...)."""
    old_spec = old.get("spec") or {}
    new_spec = new.get("spec") or {}
    if _comparable_pod_spec(old_spec) != _comparable_pod_spec(new_spec):
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not change fields other than '
            "`spec.containers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions "
            "to existing tolerations), `spec.terminationGracePeriodSeconds`",
            {"name": name, "kind": "Pod", "causes": [{"reason": "FieldValueForbidden", "field": "spec"}]},
        )
