"""The DRA mode's pure core (docs/dra.md): HAMi's names, the resource.k8s.io/v1 objects, the translation."""

from hami_common.dra.objects import (
    CapacityRequirements,
    CelSelector,
    DeviceClaim,
    DeviceConstraint,
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    ResourceClaimSpec,
    ResourceClaimTemplate,
    ResourceClaimTemplateSpec,
    TemplateMeta,
)
from hami_common.dra.translate import (
    BAD_ANNOTATION_VALUE,
    PARTIAL_PERCENTAGE,
    DraPreferences,
    claim_entry_name,
    claim_spec,
    managed_names,
    preferences,
    template_name,
    type_selector,
)

__all__ = [
    "BAD_ANNOTATION_VALUE",
    "PARTIAL_PERCENTAGE",
    "CapacityRequirements",
    "CelSelector",
    "DeviceClaim",
    "DeviceConstraint",
    "DeviceRequest",
    "DeviceSelector",
    "DraPreferences",
    "ExactDeviceRequest",
    "ResourceClaimSpec",
    "ResourceClaimTemplate",
    "ResourceClaimTemplateSpec",
    "TemplateMeta",
    "claim_entry_name",
    "claim_spec",
    "managed_names",
    "preferences",
    "template_name",
    "type_selector",
]
