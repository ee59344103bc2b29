"""The subset of ``resource.k8s.io/v1`` the DRA mode writes, as msgspec Structs (field names as the API's):
the webhook's ResourceClaimTemplates and the node agent's ResourceSlices.

Only what the translation sets is declared; unset fields are left out of the JSON, so the apiserver fills
its defaults and its validation judges exactly what we wrote.
"""

from __future__ import annotations

import msgspec

from hami_common.dra.names import API_VERSION, SLICE_KIND, TEMPLATE_KIND

__all__ = [
    "CapacityRange",
    "CapacityRequestPolicy",
    "CapacityRequirements",
    "CelSelector",
    "ClaimReference",
    "Device",
    "DeviceAttribute",
    "DeviceCapacity",
    "DeviceClaim",
    "DeviceConstraint",
    "DeviceRequest",
    "DeviceSelector",
    "ExactDeviceRequest",
    "PodResourceClaim",
    "ResourceClaimSpec",
    "ResourceClaimTemplate",
    "ResourceClaimTemplateSpec",
    "ResourcePool",
    "ResourceSlice",
    "ResourceSliceSpec",
    "SliceMeta",
    "SliceOwner",
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


# --- ResourceSlice: what a node's GPUs look like to kube-scheduler (written by the node agent) ----------------


class DeviceAttribute(_Wire, frozen=True):
    """Exactly one of the typed values is set (the API refuses none or two)."""

    int_: int | None = msgspec.field(default=None, name="int")
    string: str | None = None
    bool_: bool | None = msgspec.field(default=None, name="bool")


class CapacityRange(_Wire, frozen=True):
    """A request below ``min`` is rounded up to it, then up to ``min + n * step``."""

    min: str
    step: str | None = None
    max: str | None = None


class CapacityRequestPolicy(_Wire, frozen=True):
    """What a claim consumes: ``default`` when it names no amount, else its request rounded by ``validRange``."""

    default: str
    valid_range: CapacityRange | None = None


class DeviceCapacity(_Wire, frozen=True):
    value: str  # a quantity: memory in bytes, cores in percent
    request_policy: CapacityRequestPolicy | None = None


class Device(_Wire, frozen=True):
    name: str
    attributes: dict[str, DeviceAttribute]
    capacity: dict[str, DeviceCapacity]
    # consumable capacity (KEP-5075): many claims share the device, each consuming part of its capacity
    allow_multiple_allocations: bool | None = None


class ResourcePool(_Wire, frozen=True):
    """The slices of one pool with the highest ``generation`` are the pool; the scheduler waits until it has
    ``resourceSliceCount`` of them. Neither field has a default, so both are always written."""

    name: str
    generation: int
    resource_slice_count: int


class ResourceSliceSpec(_Wire, frozen=True):
    driver: str
    pool: ResourcePool
    node_name: str
    devices: tuple[Device, ...]


class SliceOwner(_Wire, frozen=True):
    """The Node the slice describes: the garbage collector deletes the slice with it."""

    api_version: str
    kind: str
    name: str
    uid: str


class SliceMeta(_Wire, frozen=True):
    name: str
    labels: dict[str, str] | None = None
    owner_references: tuple[SliceOwner, ...] = ()


class ResourceSlice(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Written whole, apiVersion and kind included (as :class:`ResourceClaimTemplate`)."""

    metadata: SliceMeta
    spec: ResourceSliceSpec
    api_version: str = msgspec.field(default=API_VERSION, name="apiVersion")
    kind: str = SLICE_KIND
