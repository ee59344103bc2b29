"""The part of a Pod the webhook reads, as msgspec Structs decoded from the AdmissionReview's raw object.

Only what a rule looks at is declared; everything else stays in the raw JSON and is never touched, so
the JSON Patch the webhook returns changes exactly the fields its rules change. ``None`` means "absent"
where the difference matters to the patch (adding ``env`` versus appending to it).
"""

from __future__ import annotations

import msgspec

from hami_common.errors import InvalidInput
from hami_common.resources import ContainerResources

__all__ = [
    "ALL_CAPABILITIES",
    "POD_API_VERSION",
    "POD_KIND",
    "SYS_ADMIN",
    "Capabilities",
    "ContainerSpec",
    "EnvVar",
    "PodMeta",
    "PodSpecView",
    "PodView",
    "Resources",
    "SecurityContext",
    "decode_pod",
]

POD_API_VERSION = "v1"
POD_KIND = "Pod"
SYS_ADMIN = "SYS_ADMIN"  # a capability as securityContext.capabilities names it (with or without CAP_)
ALL_CAPABILITIES = "ALL"  # the runtimes' word for every capability (any case), CAP_SYS_ADMIN among them
# Far beyond any quantity the apiserver stores; longer digit strings would not even convert to int.
MAX_QUANTITY_LENGTH = 64


class _Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Base of the pod view: immutable, camelCase on the wire, unknown fields ignored."""


class EnvVar(_Wire, frozen=True):
    """An env entry; ``valueFrom`` entries decode with ``value=None`` and are kept as they are."""

    name: str
    value: str | None = None


class Capabilities(_Wire, frozen=True):
    add: tuple[str, ...] | None = None


class SecurityContext(_Wire, frozen=True):
    privileged: bool | None = None
    capabilities: Capabilities | None = None


class Resources(_Wire, frozen=True):
    limits: dict[str, str] | None = None
    requests: dict[str, str] | None = None


class ContainerSpec(_Wire, frozen=True):
    name: str = ""
    resources: Resources | None = None
    env: tuple[EnvVar, ...] | None = None
    security_context: SecurityContext | None = None

    @property
    def privileged(self) -> bool:
        return self.security_context is not None and self.security_context.privileged is True

    @property
    def added_sys_admin(self) -> str | None:
        """How the container adds CAP_SYS_ADMIN (the name it wrote: ``SYS_ADMIN``, ``cap_sys_admin``, or
        ``ALL`` in any case, which the runtimes expand to every capability), or None. CAP_SYS_ADMIN lets a
        container remount what the device plugin mounted (the interposer's preload)."""
        ctx = self.security_context
        added = ctx.capabilities.add if ctx is not None and ctx.capabilities is not None else None
        for cap in added or ():
            if cap.upper().removeprefix("CAP_") in (SYS_ADMIN, ALL_CAPABILITIES):
                return cap
        return None

    def as_resources(self) -> ContainerResources:
        """The limits and requests in the form :mod:`hami_common.resources` reads."""
        res = self.resources
        if res is None:
            return ContainerResources(self.name)
        return ContainerResources(self.name, res.limits or {}, res.requests or {})


class PodSpecView(_Wire, frozen=True):
    containers: tuple[ContainerSpec, ...] = ()
    init_containers: tuple[ContainerSpec, ...] = ()
    ephemeral_containers: tuple[ContainerSpec, ...] = ()
    scheduler_name: str | None = None
    node_name: str = ""
    runtime_class_name: str | None = None


class PodMeta(_Wire, frozen=True):
    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""
    annotations: dict[str, str] | None = None


class PodView(_Wire, frozen=True):
    api_version: str = ""
    kind: str = ""
    metadata: PodMeta = msgspec.field(default_factory=PodMeta)
    spec: PodSpecView = msgspec.field(default_factory=PodSpecView)

    @property
    def annotations(self) -> dict[str, str]:
        return self.metadata.annotations or {}


_DECODER = msgspec.json.Decoder(PodView)


def decode_pod(raw: bytes) -> PodView:
    """Decode the review's ``object``; raises InvalidInput when it is not a core/v1 Pod."""
    try:
        pod = _DECODER.decode(raw)
    except msgspec.DecodeError as err:  # ValidationError is a DecodeError
        raise InvalidInput(f"cannot decode the pod: {err}") from err
    except RecursionError as err:  # nested past the recursion limit: malformed input all the same
        raise InvalidInput(f"cannot decode the pod: {err}") from err
    if (pod.api_version or pod.kind) and (pod.api_version, pod.kind) != (POD_API_VERSION, POD_KIND):
        raise InvalidInput(f"expected a {POD_API_VERSION} {POD_KIND}, got {pod.api_version} {pod.kind}")
    spec = pod.spec
    for ctr in (*spec.init_containers, *spec.containers, *spec.ephemeral_containers):
        res = ctr.resources
        if res is None:
            continue
        for quantities in (res.limits, res.requests):
            for name, text in (quantities or {}).items():
                if len(text) > MAX_QUANTITY_LENGTH:
                    raise InvalidInput(f"container {ctr.name}: quantity of {name} is {len(text)} characters long")
    return pod
