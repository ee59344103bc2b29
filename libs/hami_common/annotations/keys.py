"""Every HAMi annotation and label key: the only place these strings are written (hami-protocol §2)."""

from __future__ import annotations

from typing import Final

# --- Node: inventory and hand-off (hami-protocol §2.1-2.4, §2.7) ---------------------------------
NODE_REGISTER: Final = "hami.io/node-nvidia-register"
NODE_SCORE: Final = "hami.io/node-nvidia-score"
NODE_HANDSHAKE: Final = "hami.io/node-handshake"  # NVIDIA has no vendor suffix
NODE_LOCK: Final = "hami.io/mutex.lock"
# Ours: written by our node agent beside its registration. "bus": the node's allocator takes its placements
# over NATS and asks the kubelet which pod an Allocate is for, so a bind needs no HAMi node lock there (HAMi's
# device plugin, which finds its pod through the lock, never writes it).
NODE_PLACEMENTS: Final = "hami.io/node-placements"
NODE_PLACEMENTS_BUS: Final = "bus"
DEVICE_CORDON: Final = "hami.io/device-cordon"

# --- Pod: written by the scheduler and the device plugin (§2.1, §2.5, §2.6) ----------------------
VGPU_NODE: Final = "hami.io/vgpu-node"  # annotation and label
VGPU_TIME: Final = "hami.io/vgpu-time"
DEVICES_TO_ALLOCATE: Final = "hami.io/vgpu-devices-to-allocate"
DEVICES_ALLOCATED: Final = "hami.io/vgpu-devices-allocated"
MIG_ALLOCATIONS: Final = "hami.io/vgpu-mig-allocations"
BIND_TIME: Final = "hami.io/bind-time"
BIND_PHASE: Final = "hami.io/bind-phase"
TRACE_CONTEXT: Final = "hami.io/trace-context"  # ours: W3C traceparent of the pod's scheduling trace
# Ours: the scheduler's HMAC over the pod's UID, node and device list (hami_common.grants); the allocator
# serves an annotation-only allocation only when it verifies.
GRANT_SIGNATURE: Final = "hami.io/vgpu-grant"

BIND_PHASE_ALLOCATING: Final = "allocating"
BIND_PHASE_SUCCESS: Final = "success"
BIND_PHASE_FAILED: Final = "failed"

# --- Pod: set by users (§2.9) ---------------------------------------------------------------------
NODE_SCHEDULER_POLICY: Final = "hami.io/node-scheduler-policy"
GPU_SCHEDULER_POLICY: Final = "hami.io/gpu-scheduler-policy"
DEVICE_SCORING_WEIGHTS: Final = "hami.io/device-scoring-weights"
USE_GPUTYPE: Final = "nvidia.com/use-gputype"
NOUSE_GPUTYPE: Final = "nvidia.com/nouse-gputype"
USE_GPUUUID: Final = "nvidia.com/use-gpuuuid"
NOUSE_GPUUUID: Final = "nvidia.com/nouse-gpuuuid"
NUMA_BIND: Final = "nvidia.com/numa-bind"
VGPU_MODE: Final = "nvidia.com/vgpu-mode"

# Their vocabularies (§2.9, §4.5-4.6); case matters, as in HAMi.
BINPACK: Final = "binpack"
SPREAD: Final = "spread"
TOPOLOGY_AWARE: Final = "topology-aware"
MUTEX: Final = "mutex"
NUMA: Final = "numa"
NODE_POLICIES: Final = (BINPACK, SPREAD)  # node-scheduler-policy: the whole value; anything else is binpack
GPU_POLICIES: Final = (BINPACK, SPREAD, TOPOLOGY_AWARE, MUTEX, NUMA)  # gpu-scheduler-policy: each of a comma chain
MODE_HAMI_CORE: Final = "hami-core"  # a card's operating mode (§2.2), and what vgpu-mode is matched against
MODE_MIG: Final = "mig"
VGPU_MODES: Final = (MODE_HAMI_CORE, MODE_MIG)  # vgpu-mode keeps the cards whose mode the value contains

# The pod annotations a tenant sets for NVIDIA and the generic policies.
USER_POD_ANNOTATIONS: Final[frozenset[str]] = frozenset(
    {
        NODE_SCHEDULER_POLICY,
        GPU_SCHEDULER_POLICY,
        DEVICE_SCORING_WEIGHTS,
        USE_GPUTYPE,
        NOUSE_GPUTYPE,
        USE_GPUUUID,
        NOUSE_GPUUUID,
        NUMA_BIND,
        VGPU_MODE,
    }
)

# --- Labels ----------------------------------------------------------------------------------------
SCHEDULER_ROLE: Final = "hami.io/scheduler-role"
SCHEDULER_ROLE_LEADER: Final = "leader"
SCHEDULER_ROLE_FOLLOWER: Final = "follower"
WEBHOOK_LABEL: Final = "hami.io/webhook"
WEBHOOK_IGNORE: Final = "ignore"
POD_GROUP_LABEL: Final = "scheduling.x-k8s.io/pod-group"
# Ours: a namespace label that lets its pods keep CUDA_DISABLE_CONTROL (the webhook strips it otherwise).
ALLOW_DISABLE_CONTROL: Final = "hami.io/allow-disable-control"

# Annotations only the system may write: a tenant setting one could forge an allocation (ARCHITECTURE §3).
SCHEDULER_OWNED: Final[frozenset[str]] = frozenset(
    {
        VGPU_NODE,
        VGPU_TIME,
        DEVICES_TO_ALLOCATE,
        DEVICES_ALLOCATED,
        MIG_ALLOCATIONS,
        BIND_TIME,
        BIND_PHASE,
        NODE_LOCK,
        TRACE_CONTEXT,
        GRANT_SIGNATURE,
    }
)

# Every pod annotation key of HAMi's and ours, beside each device family's own (``DeviceFamily``'s
# ``user_annotations`` and ``owned_annotations``): what the webhook compares an unknown key with.
POD_ANNOTATIONS: Final[frozenset[str]] = USER_POD_ANNOTATIONS | SCHEDULER_OWNED

# The scheduler-owned keys that carry or gate a grant, guarded by the ValidatingAdmissionPolicy even when the
# mutating webhook is skipped or down (deploy/kustomize/base/webhook/scheduler-owned-policy.yaml). The
# trace context is left out: our mutating webhook adds it on CREATE, before validation sees the pod.
GRANT_OWNED: Final[frozenset[str]] = SCHEDULER_OWNED - {TRACE_CONTEXT}
# Scheduler-owned labels: HAMi's scheduler labels bound pods with the node (VGPU_NODE is both).
SCHEDULER_OWNED_LABELS: Final[frozenset[str]] = frozenset({VGPU_NODE})

# The vendor word in device lists and requests; a device's `type` is the model string (§2.5, §9 item 5).
NVIDIA_VENDOR: Final = "NVIDIA"
