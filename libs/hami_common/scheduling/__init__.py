"""The placement engine: pure functions from usage snapshots and a pod's request to a placement.

No I/O, no clock, no environment: the extender owns the ledger of usage and calls these functions.
Vendor-pluggable like HAMi's device interface (:class:`Vendor`); NVIDIA is the first backend.
"""

from hami_common.scheduling.float32 import f32
from hami_common.scheduling.health import NodeHealth, NodeReport, allocatable_gpus, node_health
from hami_common.scheduling.nvidia import NVIDIA, NvidiaVendor
from hami_common.scheduling.placement import (
    DEFAULT_VENDORS,
    NodeFit,
    NodeScorer,
    PodFamilies,
    choose_node,
    fit_container,
    fit_node,
    preference,
    unregistered,
)
from hami_common.scheduling.policy import (
    DEFAULT_SCHEDULER_NAME,
    NodePolicy,
    PodPreferences,
    SchedulerDefaults,
    ScoringWeights,
    cordoned_devices,
    parse_scoring_weights,
    preferences_from_annotations,
)
from hami_common.scheduling.preemption import Candidate, VictimChoice, choose_victims
from hami_common.scheduling.quota import NamespaceQuota, quota_from_hard
from hami_common.scheduling.reason import Reason, render_reasons
from hami_common.scheduling.score import device_score, node_score, sort_devices
from hami_common.scheduling.usage import (
    DeviceCharge,
    DeviceUsage,
    NodeUsage,
    apply_charges,
    collapse_devices,
    device_usage_from,
)
from hami_common.scheduling.vendor import ContainerFit, FitContext, Vendor

__all__ = [
    "DEFAULT_SCHEDULER_NAME",
    "DEFAULT_VENDORS",
    "NVIDIA",
    "Candidate",
    "ContainerFit",
    "DeviceCharge",
    "DeviceUsage",
    "FitContext",
    "NamespaceQuota",
    "NodeFit",
    "NodeHealth",
    "NodePolicy",
    "NodeReport",
    "NodeScorer",
    "NodeUsage",
    "NvidiaVendor",
    "PodFamilies",
    "PodPreferences",
    "Reason",
    "SchedulerDefaults",
    "ScoringWeights",
    "Vendor",
    "VictimChoice",
    "allocatable_gpus",
    "apply_charges",
    "choose_node",
    "choose_victims",
    "collapse_devices",
    "cordoned_devices",
    "device_score",
    "device_usage_from",
    "f32",
    "fit_container",
    "fit_node",
    "node_health",
    "node_score",
    "parse_scoring_weights",
    "preference",
    "preferences_from_annotations",
    "quota_from_hard",
    "render_reasons",
    "sort_devices",
    "unregistered",
]
