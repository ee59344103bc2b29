"""Mutating admission webhooks, called on create as kube-apiserver's MutatingAdmissionWebhook plugin calls them.

The ``admissionregistration.k8s.io/v1`` ``mutatingwebhookconfigurations`` stored in the emulator are read on
every create; each webhook whose rules, namespaceSelector, objectSelector and matchConditions select the
request gets an ``admission.k8s.io/v1`` AdmissionReview over HTTPS (``clientConfig.url``, trusting
``caBundle``, ``?timeout=<n>s``), in configuration-name order. A returned JSONPatch mutates the object the
next webhook and the store see; a refusal or a failure to call (``failurePolicy: Fail``) refuses the create
with kube-apiserver's Status. Each webhook's ``response.warnings`` go to the request's
:class:`~hami_sim.kubeapi._warnings.WarningRecorder`, allowed or refused, as kube-apiserver hands them to the
client. matchConditions are evaluated with cel-python when it is installed.
"""

from __future__ import annotations

import base64
import binascii
import functools
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import msgspec

from hami_sim.http import HttpClient, HttpError
from hami_sim.kubeapi._errors import ApiError
from hami_sim.kubeapi._objects import admission_view
from hami_sim.kubeapi._patch import PatchError, apply_json_patch
from hami_sim.kubeapi._resources import ResourceType, find
from hami_sim.kubeapi._selectors import FieldSelector, LabelSelector, SelectorError, label_selector_of
from hami_sim.kubeapi._store import Store
from hami_sim.kubeapi._warnings import WarningRecorder

__all__ = ["ADMIN", "Caller", "Webhooks", "webhook_configurations"]

JsonObj = dict[str, Any]
ADMISSION_V1: Final = "admission.k8s.io/v1"
DEFAULT_TIMEOUT_S: Final = 10
_CONFIGS: Final = find("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations")
_NAMESPACES: Final = find("", "v1", "namespaces")
_NOT_ADMITTED: Final = frozenset({"mutatingwebhookconfigurations", "bindings"})  # as upstream: no webhook for these


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes the request: the emulator authenticates nobody, so every client is the admin unless it
    impersonates someone (``Impersonate-User`` / ``Impersonate-Group``, as ``kubectl --as``)."""

    username: str
    groups: tuple[str, ...]

    def info(self) -> JsonObj:
        return {"username": self.username, "groups": list(self.groups)}


ADMIN: Final = Caller("kubernetes-admin", ("system:masters", "system:authenticated"))


class _Response(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    uid: str = ""
    allowed: bool = False
    status: dict[str, Any] | None = None
    patch: str | None = None
    patch_type: str | None = None
    warnings: list[str] | None = None


class _Review(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str = ""
    kind: str = ""
    response: _Response | None = None


class _CallFailed(Exception):
    """Calling the webhook failed (kube-apiserver's ErrCallingWebhook): the failurePolicy decides."""


def webhook_configurations() -> ResourceType:
    assert _CONFIGS is not None
    return _CONFIGS


def _namespaces() -> ResourceType:
    assert _NAMESPACES is not None
    return _NAMESPACES


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return {"metadata": {"labels": (obj.get("metadata") or {}).get("labels") or {}}}


def _split(resource: str) -> tuple[str, str]:
    name, _, sub = resource.partition("/")
    return name, sub


def _rule_matches(rule: Mapping[str, Any], rt: ResourceType, operation: str, namespaced: bool) -> bool:
    if not ({operation, "*"} & set(rule.get("operations") or [])):
        return False
    if not ({rt.group, "*"} & set(rule.get("apiGroups") or [])):
        return False
    if not ({rt.version, "*"} & set(rule.get("apiVersions") or [])):
        return False
    scope = rule.get("scope") or "*"
    if scope != "*" and (scope == "Namespaced") != namespaced:
        return False
    resources = [_split(str(r)) for r in rule.get("resources") or []]
    return any(res in ("*", rt.plural) and sub in ("*", "") for res, sub in resources)


def _failure_ignored(hook: Mapping[str, Any]) -> bool:
    return hook.get("failurePolicy") == "Ignore"


def _denied(name: str, status: Mapping[str, Any] | None) -> ApiError:
    """The refusal as kube-apiserver words it: the webhook's Status, its message prefixed, code >= 400."""
    result = dict(status or {})
    code = int(result.get("code") or 0)
    denied_by = f'admission webhook "{name}" denied the request'
    if result.get("message"):
        message = f"{denied_by}: {result['message']}"
    elif result.get("reason"):
        message = f"{denied_by}: {result['reason']}"
    else:
        message = f"{denied_by} without explanation"
    details = result.get("details")
    reason = str(result.get("reason") or "")
    return ApiError(max(code, 400), reason, message, details if isinstance(details, dict) else None)


def _call_failed(name: str, why: str) -> ApiError:
    text = f'failed calling webhook "{name}": {why}'
    return ApiError(500, "InternalError", f"Internal error occurred: {text}", {"causes": [{"message": text}]})


def _forbidden(rt: ResourceType, name: str, why: str) -> ApiError:
    resource = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
    subject = f'{resource} "{name}"' if name else resource
    details: JsonObj = {"name": name, "kind": rt.plural} if name else {"kind": rt.plural}
    if rt.group:
        details["group"] = rt.group
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {why}", details)


def _tls(ca_bundle: object) -> ssl.SSLContext:
    if not ca_bundle:
        return ssl.create_default_context()
    try:
        pem = base64.b64decode(str(ca_bundle), validate=True).decode()
        return ssl.create_default_context(cadata=pem)
    except (binascii.Error, UnicodeDecodeError, ssl.SSLError) as err:
        raise _CallFailed(f"could not get REST client: unable to load root certificates: {err}") from None


def _transport_error(url: str, err: HttpError) -> str:
    cause = err.__cause__
    where = url.split("://", 1)[-1].split("/", 1)[0]
    if isinstance(cause, ConnectionRefusedError):
        detail = f"dial tcp {where}: connect: connection refused"
    elif isinstance(cause, ssl.SSLCertVerificationError):
        detail = f"tls: failed to verify certificate: {cause.verify_message}"
    elif isinstance(cause, TimeoutError) or "no reply within" in str(err):
        detail = "context deadline exceeded"
    else:
        detail = str(cause or err)
    return f'failed to call webhook: Post "{url}": {detail}'


@functools.cache
def _cel() -> Any:
    """cel-python, or None where it is not installed (then every matchCondition holds)."""
    try:
        import celpy
    except ImportError:  # pragma: no cover - cel-python is a dev dependency
        return None
    return celpy


@functools.lru_cache(maxsize=256)
def _program(expression: str) -> Any:
    env = _cel().Environment()
    return env.program(env.compile(expression))


def _conditions_hold(conditions: list[JsonObj], obj: JsonObj, request: JsonObj) -> tuple[bool, str]:
    """(whether the webhook is called, why a condition failed to evaluate); any false condition skips it."""
    celpy = _cel()
    if celpy is None or not conditions:
        return True, ""
    activation = {
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(None),
        "request": celpy.json_to_cel(request),
    }
    errors = []
    for condition in conditions:
        try:
            result = _program(str(condition.get("expression", ""))).evaluate(activation)
        except Exception as err:  # cel-python raises its own error types for compile and eval failures
            errors.append(f"{condition.get('name')}: {err}")
            continue
        if not isinstance(result, celpy.celtypes.BoolType):
            errors.append(f"{condition.get('name')}: expression did not evaluate to a bool: {result!r}")
        elif not result:
            return False, ""
    return not errors, "; ".join(errors)


def _redecoded(rt: ResourceType, namespace: str | None, patched: JsonObj) -> JsonObj:
    """A patched object decoded and defaulted again, as upstream does before the next webhook sees it."""
    try:
        return admission_view(rt, patched, namespace)
    except ApiError as err:
        raise ApiError(500, "InternalError", f"Internal error occurred: {err.message}") from None


class Webhooks:
    """``await webhooks.admit_create(rt, namespace, obj, caller)``: the object after every mutating webhook."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._cached: tuple[int, list[tuple[str, JsonObj]]] = (-1, [])

    def _hooks(self) -> list[tuple[str, JsonObj]]:
        """Every webhook of every configuration, in configuration-name order; re-read only after a change."""
        changed = self.store.changed_at(webhook_configurations())
        if changed == self._cached[0]:
            return self._cached[1]
        configs, _ = self.store.list_matching(webhook_configurations(), None, LabelSelector(), FieldSelector())
        hooks = []
        for config in sorted(configs, key=lambda c: str(c["metadata"]["name"])):
            for hook in config.get("webhooks") or []:
                if isinstance(hook, dict):
                    hooks.append((str(config["metadata"]["name"]), hook))
        self._cached = (changed, hooks)
        return hooks

    def wanted(self, rt: ResourceType) -> bool:
        """Whether a create of ``rt`` goes through admission now (any webhook registered)."""
        return rt.plural not in _NOT_ADMITTED and bool(self._hooks())

    async def admit_create(
        self,
        rt: ResourceType,
        namespace: str | None,
        obj: JsonObj,
        caller: Caller,
        *,
        dry_run: bool = False,
        warnings: WarningRecorder | None = None,
    ) -> JsonObj:
        if rt.plural in _NOT_ADMITTED:
            return obj
        hooks = self._hooks()
        if not hooks:
            return obj
        namespace_labels = self._namespace_labels(rt, namespace, obj)
        for _, hook in hooks:
            if not self._selects(hook, rt, namespace, namespace_labels, obj):
                continue
            request = self._request(rt, namespace, obj, caller, dry_run)
            called, error = _conditions_hold(list(hook.get("matchConditions") or []), obj, request)
            if error and not _failure_ignored(hook):
                name = str((obj.get("metadata") or {}).get("name") or "")
                raise _forbidden(rt, name, error)
            if called:
                obj = _redecoded(rt, namespace, await self._call(hook, obj, request, warnings))
        return obj

    def _namespace_labels(self, rt: ResourceType, namespace: str | None, obj: JsonObj) -> Mapping[str, Any]:
        if rt.plural == "namespaces":
            return _labels(obj)
        if not rt.namespaced or not namespace:
            return {}
        return _labels(self.store.get(_namespaces(), None, namespace))

    @staticmethod
    def _selects(
        hook: Mapping[str, Any], rt: ResourceType, namespace: str | None, ns_labels: Mapping[str, Any], obj: JsonObj
    ) -> bool:
        try:
            by_namespace = label_selector_of(hook.get("namespaceSelector"))
            by_object = label_selector_of(hook.get("objectSelector"))
        except SelectorError:
            return False
        scoped = rt.plural == "namespaces" or (rt.namespaced and bool(namespace))
        if scoped and not by_namespace.matches(ns_labels):
            return False
        if not by_object.matches(_labels(obj)):
            return False
        namespaced = rt.namespaced and bool(namespace)
        return any(_rule_matches(rule, rt, "CREATE", namespaced) for rule in hook.get("rules") or [])

    @staticmethod
    def _request(rt: ResourceType, namespace: str | None, obj: JsonObj, caller: Caller, dry_run: bool) -> JsonObj:
        kind = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        resource = {"group": rt.group, "version": rt.version, "resource": rt.plural}
        request: JsonObj = {
            "uid": str(uuid.uuid4()),
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
        }
        name = (obj.get("metadata") or {}).get("name")
        if name:
            request["name"] = name
        if namespace:
            request["namespace"] = namespace
        request.update(
            operation="CREATE",
            userInfo=caller.info(),
            object=obj,
            oldObject=None,
            dryRun=dry_run,  # a webhook with side effects must not have them for a dry run
            options={"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        )
        return request

    async def _call(
        self, hook: Mapping[str, Any], obj: JsonObj, request: JsonObj, warnings: WarningRecorder | None
    ) -> JsonObj:
        name = str(hook.get("name", ""))
        try:
            response = await self._exchange(hook, request)
        except _CallFailed as err:
            if _failure_ignored(hook):
                return obj
            raise _call_failed(name, str(err)) from None
        if warnings is not None:
            for text in response.warnings or ():
                warnings.add(text)
        if not response.allowed:
            raise _denied(name, response.status)
        if not response.patch:
            return obj
        try:
            patch = msgspec.json.decode(base64.b64decode(response.patch))
        except (binascii.Error, ValueError, msgspec.DecodeError) as err:
            if _failure_ignored(hook):
                return obj
            raise _call_failed(name, f"received undecodable patch in webhook response: {err}") from None
        if response.patch_type != "JSONPatch":
            if _failure_ignored(hook):
                return obj
            raise _call_failed(name, f'unsupported patch type "{response.patch_type}"')
        try:
            patched: JsonObj = apply_json_patch(obj, patch)
        except PatchError as err:
            raise ApiError(500, "InternalError", f"Internal error occurred: {err}") from None
        return patched

    async def _exchange(self, hook: Mapping[str, Any], request: JsonObj) -> _Response:
        config = hook.get("clientConfig") or {}
        url = str(config.get("url") or "")
        if not url:
            raise _CallFailed("could not get REST client: the emulator calls webhooks by clientConfig.url only")
        seconds = int(hook.get("timeoutSeconds") or DEFAULT_TIMEOUT_S)
        parts = urlsplit(url)
        path = f"{parts.path or '/'}?timeout={seconds}s"
        target = f"{parts.scheme}://{parts.netloc}{path}"
        review = {"apiVersion": ADMISSION_V1, "kind": "AdmissionReview", "request": request}
        tls = _tls(config.get("caBundle"))
        try:
            client = HttpClient(f"{parts.scheme}://{parts.netloc}", ssl_context=tls, timeout=seconds, max_connections=1)
        except ValueError as err:
            raise _CallFailed(f"could not get REST client: {err}") from None
        try:
            reply = await client.post(path, msgspec.json.encode(review), headers={"Accept": "application/json"})
        except HttpError as err:
            raise _CallFailed(_transport_error(target, err)) from None
        finally:
            await client.aclose()
        if not 200 <= reply.status < 300:
            raise _CallFailed(f"failed to call webhook: {_unexpected(reply.status, reply.body)}")
        try:
            answer = msgspec.json.decode(reply.body, type=_Review)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            raise _CallFailed(f"failed to call webhook: {err}") from None
        return _verified(answer, str(request["uid"]))


def _unexpected(code: int, body: bytes) -> str:
    try:
        status = msgspec.json.decode(body)
    except msgspec.DecodeError:
        status = None
    if isinstance(status, dict) and status.get("kind") == "Status" and status.get("message"):
        return str(status["message"])
    return f"the server responded with the status code {code} but did not return more information"


def _verified(answer: _Review, uid: str) -> _Response:
    response = answer.response
    if response is None:
        raise _CallFailed("received invalid webhook response: webhook response was absent")
    if response.uid != uid:
        raise _CallFailed(f'received invalid webhook response: expected response.uid="{uid}", got "{response.uid}"')
    if (answer.api_version, answer.kind) != (ADMISSION_V1, "AdmissionReview"):
        raise _CallFailed(
            "received invalid webhook response: expected webhook response of admission.k8s.io/v1, "
            f"Kind=AdmissionReview, got {answer.api_version}, Kind={answer.kind}"
        )
    invalid = "received invalid webhook response: webhook returned"
    if response.patch and response.patch_type is None:
        raise _CallFailed(f"{invalid} response.patch but not response.patchType")
    if not response.patch and response.patch_type is not None:
        raise _CallFailed(f"{invalid} response.patchType but not response.patch")
    return response
