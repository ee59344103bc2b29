"""The subset of ``resource.k8s.io/v1`` the DRA mode writes, as msgspec Structs (field names as the API's).

Only what the translation sets is declared; unset fields are left out of the JSON, so the apiserver fills
its defaults and its validation judges exactly what we wrote.
"""

from __future__ import annotations

import msgspec

from hami_common.dra.names import API_VERSION, TEMPLATE_KIND

__all__ = [
    "CapacityRequirements",
    "CelSelector",
    "ClaimReference",
    "DeviceClaim",
    "DeviceConstraint",
    "DeviceRequest",
    "DeviceSelector",
    "ExactDeviceRequest",
    "PodResourceClaim",
    "ResourceClaimSpec",
    "ResourceClaimTemplate",
    "ResourceClaimTemplateSpec",
    "TemplateMeta",
]


class _Wire(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Immutable, camelCase on the wire, unset fields left out."""


class CelSelector(_Wire, frozen=True):
    expression: str


class DeviceSelector(_Wire, frozen=True):
    cel: CelSelector


class CapacityRequirements(_Wire, frozen=True):
    requests: dict[str, str]  # capacity name -> quantity (memory in bytes, cores in percent)


class ExactDeviceRequest(_Wire, frozen=True):
    device_class_name: str
    allocation_mode: str
    count: int
    selectors: tuple[DeviceSelector, ...] = ()
    capacity: CapacityRequirements | None = None


class DeviceRequest(_Wire, frozen=True):
    name: str
    exactly: ExactDeviceRequest


class DeviceConstraint(_Wire, frozen=True):
    """One of ``matchAttribute`` (every device shares the value) or ``distinctAttribute`` (no two do)."""

    requests: tuple[str, ...] = ()
    match_attribute: str | None = None
    distinct_attribute: str | None = None


class DeviceClaim(_Wire, frozen=True):
    requests: tuple[DeviceRequest, ...]
    constraints: tuple[DeviceConstraint, ...] = ()


class ResourceClaimSpec(_Wire, frozen=True):
    devices: DeviceClaim


class TemplateMeta(_Wire, frozen=True):
    name: str
    namespace: str
    labels: dict[str, str] | None = None


class ResourceClaimTemplateSpec(_Wire, frozen=True):
    spec: ResourceClaimSpec


class ResourceClaimTemplate(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Written whole: apiVersion and kind too, which a defaults-omitting Struct would leave out."""

    metadata: TemplateMeta
    spec: ResourceClaimTemplateSpec
    api_version: str = msgspec.field(default=API_VERSION, name="apiVersion")
    kind: str = TEMPLATE_KIND


class ClaimReference(_Wire, frozen=True):
    """A container's ``resources.claims`` entry: the pod's claim entry it uses."""

    name: str


class PodResourceClaim(_Wire, frozen=True):
    """A pod's ``spec.resourceClaims`` entry; the resourceclaim controller makes its claim from the template,
    owned by the pod."""

    name: str
    resource_claim_template_name: str
