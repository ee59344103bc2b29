"""Every name of the DRA mode in one place: HAMi's DRA driver, its DeviceClass and attributes, the API's kinds.

The driver, class, device type, request name and capacity names are HAMi-DRA's (spec dra.md §1.1-1.2), so
a claim written here is served by HAMi's kubelet plugin (Project-HAMi/k8s-dra-driver) and read by HAMi-DRA's
monitor; the ``resource.kubernetes.io/`` attributes are Kubernetes' standard ones.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "API_VERSION",
    "ATTR_INDEX",
    "ATTR_NUMA_NODE",
    "ATTR_PCIE_BUS_ID",
    "ATTR_PCIE_ROOT",
    "ATTR_PRODUCT_NAME",
    "ATTR_TYPE",
    "ATTR_UUID",
    "CAPACITY_CORES",
    "CAPACITY_MEMORY",
    "CLAIM_SUFFIX",
    "DEVICE_CLASS",
    "DEVICE_PREFIX",
    "DEVICE_TYPE",
    "DRIVER",
    "EXACT_COUNT",
    "MAX_NAME",
    "MAX_SLICE_DEVICES",
    "REQUEST",
    "SLICE_KIND",
    "TEMPLATE_KIND",
    "TEMPLATE_PREFIX",
    "qualified",
]

API_VERSION: Final = "resource.k8s.io/v1"
TEMPLATE_KIND: Final = "ResourceClaimTemplate"
SLICE_KIND: Final = "ResourceSlice"
EXACT_COUNT: Final = "ExactCount"  # allocationMode

DRIVER: Final = "hami-core-gpu.project-hami.io"  # HAMi's kubelet plugin (binary hami-kubelet-plugin)
DEVICE_CLASS: Final = DRIVER  # HAMi-DRA's chart names the class after the driver
DEVICE_TYPE: Final = "hami-gpu"  # the `type` attribute of every HAMi-core GPU device
REQUEST: Final = "gpu"  # the one request of a container's claim
DEVICE_PREFIX: Final = "hami-gpu-"  # a published device is hami-gpu-<index>, as HAMi's kubelet plugin names it
MAX_SLICE_DEVICES: Final = 128  # the API's limit per ResourceSlice (64 with taints or counters: we set neither)

# Capacity of a device (consumable, KEP-5075): memory in bytes (whole card by default), cores in percent.
CAPACITY_MEMORY: Final = "memory"
CAPACITY_CORES: Final = "cores"

# Attributes of HAMi's devices, relative to the driver (device.attributes[DRIVER].<name> in CEL) ...
ATTR_TYPE: Final = "type"
ATTR_UUID: Final = "uuid"
ATTR_PRODUCT_NAME: Final = "productName"
ATTR_INDEX: Final = "index"
ATTR_PCIE_BUS_ID: Final = "pcieBusID"
# ... and Kubernetes' standard ones, fully qualified. HAMi's plugin publishes pcieRoot; numaNode is KEP-6072's.
ATTR_PCIE_ROOT: Final = "resource.kubernetes.io/pcieRoot"
ATTR_NUMA_NODE: Final = "resource.kubernetes.io/numaNode"

# Names the webhook gives: a pod's claim entry is `<container>-nvidia` (HAMi-DRA's vendor suffix); a template
# is `hami-nvidia-<digest of its spec>`, shared by every pod of the namespace that asks the same.
CLAIM_SUFFIX: Final = "nvidia"
TEMPLATE_PREFIX: Final = "hami-nvidia-"
MAX_NAME: Final = 63  # a DNS-1123 label: what a pod's claim entry name must be


def qualified(attribute: str) -> str:
    """A driver attribute's fully qualified name, as constraints name it (``<driver>/<name>``)."""
    return f"{DRIVER}/{attribute}"
