"""The complete Allocate answer for one container, from a pod's placement and the node's config (pure).

Both sides of the node use it: the node agent pre-stages answers from a :class:`PlacementDecision`
(:func:`from_placement`), and the device plugin builds them itself from the pod's
``hami.io/vgpu-devices-to-allocate`` annotation when nothing is staged (:func:`from_annotation`).
The answer is HAMi's (hami-protocol §5.4, §9 item 10):

* env ``NVIDIA_VISIBLE_DEVICES`` (the granted physical UUIDs), ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` (``<MiB>m``),
  ``CUDA_DEVICE_SM_LIMIT`` (cores of the *first* device), ``CUDA_DEVICE_MEMORY_SHARED_CACHE``
  (``$HOOK/vgpu/<uuid>.cache``), ``CUDA_TASK_PRIORITY``, ``GPU_CORE_UTILIZATION_POLICY``,
  ``CUDA_OVERSUBSCRIBE``, ``LIBCUDA_LOG_LEVEL`` where configured;
* mounts ``$HOOK/vgpu/libvgpu.so`` (read-only), the per-container cache directory
  ``$HOOK/vgpu/containers/<podUID>_<ctr>`` at ``$HOOK/vgpu``, ``/tmp/vgpulock``, ``/etc/ld.so.preload``
  unless the container sets ``CUDA_DISABLE_CONTROL``;
* and, ours: a read-only limits file (``KEY=VALUE`` lines, the same values as the env) mounted at
  ``/etc/vgpu/limits``, where ``libvgpu.so`` reads it first, so a scrubbed environment cannot drop a limit.
  It always names the core policy and the task priority (``default`` and 1 unless the allocation says
  otherwise): with the file in place the interposer takes those two from it alone, and the node agent's
  priority feedback reads the priority back from it (:func:`task_priority`), never from the container.

The host-side effects (create the cache directory, write the limits file) are described by
:class:`ContainerAllocation` and performed by the caller (``hami_common.staging.write_host_files``).

A container granted MIG instances (its grant carries ``hami.io/vgpu-mig-allocations`` reservations) gets
HAMi's MIG answer instead (§5.4): the MIG devices' UUIDs as ``NVIDIA_VISIBLE_DEVICES`` (and CDI names where
configured), and none of the HAMi-core variables, mounts or host files. Those UUIDs exist only once the
device plugin has created the instances, so :func:`build_container` returns the answer without them
(``pending_mig``), and the plugin completes it at Allocate with :func:`mig_answer`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from hami_common import envvars
from hami_common.annotations import MigAllocation, PodDevices
from hami_common.errors import InvalidInput
from hami_common.events import PlacementDecision

__all__ = [
    "DEFAULT_TASK_PRIORITY",
    "LIMITS_CONTAINER_PATH",
    "ContainerAllocation",
    "ContainerGrant",
    "ContainerResponse",
    "DeviceSpec",
    "GrantedDevice",
    "Mount",
    "NodeAllocationConfig",
    "PodGrant",
    "build_container",
    "build_pod",
    "from_annotation",
    "from_placement",
    "is_true",
    "mig_answer",
    "pair_mig",
    "render_limits",
    "task_priority",
]

LIMITS_CONTAINER_PATH: Final = "/etc/vgpu/limits"  # native/vgpu reads it here (VGPU_LIMITS_FILE)
VGPU_LOCK_PATH: Final = "/tmp/vgpulock"
LD_SO_PRELOAD: Final = "/etc/ld.so.preload"
_TRUE_WORDS: Final = frozenset({"1", "t", "true"})  # Go's strconv.ParseBool, case-insensitively
_SAFE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_CACHE_NAMESPACE: Final = uuid.UUID("6d1a2c0e-5b7f-4c3e-9a51-0f4d2b8e7c19")
_POLICY_DEFAULT: Final = frozenset({"", "default"})
_POLICY_DEFAULT_WORD: Final = "default"
_INTEGER: Final = re.compile(r"[+-]?[0-9]+")  # what the interposer's strtol accepts, without Python's "1_0"
_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1
DEFAULT_TASK_PRIORITY: Final = 1  # HAMi-core's CUDA_TASK_PRIORITY when none is given: the least important
_POLICY_DISABLE: Final = "disable"


# --- the answer (msgspec: it is stored in the staging store) ---------------------------------------------


class Mount(msgspec.Struct, frozen=True, kw_only=True):
    container_path: str
    host_path: str
    read_only: bool = False


class DeviceSpec(msgspec.Struct, frozen=True, kw_only=True):
    container_path: str
    host_path: str
    permissions: str = "rw"


class ContainerResponse(msgspec.Struct, frozen=True, kw_only=True):
    """One ``ContainerAllocateResponse`` (k8s-interfaces §1.3), free of protobuf."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...] = ()
    devices: tuple[DeviceSpec, ...] = ()
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


class ContainerAllocation(msgspec.Struct, frozen=True, kw_only=True):
    """What one container gets, and what must exist on the host before it starts."""

    name: str
    device_uuids: tuple[str, ...]  # one per granted device, in annotation order
    response: ContainerResponse
    cache_dir: str  # host directory, created world-writable (the interposer runs as any user); "" for MIG
    limits_host_path: str
    limits_content: str
    # MIG containers only: one reservation per device, in device order; realised (runtime ids set) once the
    # plugin has created the instances and completed the answer (:func:`mig_answer`).
    mig: tuple[MigAllocation, ...] = ()

    @property
    def device_count(self) -> int:
        return len(self.device_uuids)

    @property
    def pending_mig(self) -> bool:
        """A MIG answer whose instances are not created yet: not to be sent as it is."""
        return any(not m.realised for m in self.mig)


# --- the inputs --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeAllocationConfig:
    """The node's device-plugin knobs that shape an Allocate answer (hami-protocol §1.2, §5.4)."""

    hook_path: str = "/usr/local"
    libvgpu_host_path: str = ""  # empty: $HOOK/vgpu/libvgpu.so (the edge may resolve a versioned file)
    limits_host_dir: str = ""  # empty: $HOOK/vgpu/limits, outside every container's writable cache dir
    device_memory_scaling: float = 1.0
    core_policy: str = ""  # gpuCorePolicy: "force" or "disable" is passed on; "" / "default" sets nothing
    disable_core_limit: bool = False
    libcuda_log_level: str = ""
    cdi_kind: str = ""  # e.g. "nvidia.com/gpu": also answer CDI names "<kind>=<uuid>"

    @property
    def vgpu_dir(self) -> str:
        return f"{self.hook_path.rstrip('/')}/vgpu"


@dataclass(frozen=True, slots=True)
class GrantedDevice:
    uuid: str
    usedmem_mib: int
    usedcores: int


@dataclass(frozen=True, slots=True)
class ContainerGrant:
    name: str
    devices: tuple[GrantedDevice, ...]
    priority: int | None = None
    disable_control: bool = False  # the container's env sets CUDA_DISABLE_CONTROL to true
    mig: tuple[MigAllocation, ...] = ()  # MIG reservations of this container, one per device, in device order


@dataclass(frozen=True, slots=True)
class PodGrant:
    """A pod's grants, containers in HAMi order (init containers first); GPU-less ones have no devices."""

    pod_uid: str
    namespace: str
    name: str
    containers: tuple[ContainerGrant, ...]


def is_true(text: str) -> bool:
    """``CUDA_DISABLE_CONTROL`` is true as Go's ``strconv.ParseBool`` reads it."""
    return text.strip().lower() in _TRUE_WORDS


def from_placement(decision: PlacementDecision, *, disable_control: Collection[str] = ()) -> PodGrant:
    """The grants of a placement decision; ``disable_control`` names containers with CUDA_DISABLE_CONTROL."""
    return PodGrant(
        pod_uid=decision.pod_uid,
        namespace=decision.namespace,
        name=decision.name,
        containers=tuple(
            ContainerGrant(
                name=c.name,
                devices=tuple(GrantedDevice(d.uuid, d.usedmem_mib, d.usedcores) for d in c.devices),
                priority=c.priority,
                disable_control=c.name in disable_control,
                mig=pair_mig(decision.pod_uid, c.name, [d.uuid for d in c.devices], c.mig),
            )
            for c in decision.containers
        ),
    )


def pair_mig(pod: str, container: str, uuids: Sequence[str], mig: Sequence[MigAllocation]) -> tuple[MigAllocation, ...]:
    """One container's reservations in device order; InvalidInput unless there is exactly one for each
    device, on that device's GPU (or none at all: not a MIG container)."""
    if not mig:
        return ()
    by_device = sorted(mig, key=lambda m: m.device_index)
    if [m.device_index for m in by_device] != list(range(len(uuids))):
        raise InvalidInput(
            f"pod {pod} container {container}: MIG reservations for devices "
            f"{[m.device_index for m in by_device]}, but it was granted {len(uuids)} device(s)"
        )
    for m, granted in zip(by_device, uuids, strict=True):
        if m.gpu_uuid != granted:
            raise InvalidInput(
                f"pod {pod} container {container}: MIG reservation of device {m.device_index} is on "
                f"{m.gpu_uuid}, the device granted is {granted}"
            )
    return tuple(by_device)


def from_annotation(
    *,
    pod_uid: str,
    namespace: str,
    name: str,
    container_names: Sequence[str],
    devices: PodDevices,
    priorities: Mapping[str, int] | None = None,
    disable_control: Collection[str] = (),
    mig: Sequence[MigAllocation] = (),
) -> PodGrant:
    """Pair a decoded device list with the pod's containers (init first), as HAMi lists them.

    The decoder's extra empty entry after the trailing ``;`` is dropped; a device entry for a container
    the pod does not have raises :class:`InvalidInput`. ``mig`` (the decoded ``hami.io/vgpu-mig-allocations``)
    is paired by ``containerIndex``, the container's place in that same order; a reservation that names
    no container, or does not match the container's non-empty device list, raises :class:`InvalidInput`.
    """
    extra = devices[len(container_names) :]
    if any(extra):
        raise InvalidInput(
            f"pod {namespace}/{name}: device list grants devices to more than its {len(container_names)} containers"
        )
    stray = sorted({m.container_index for m in mig if m.container_index >= len(container_names)})
    if stray:
        raise InvalidInput(f"pod {namespace}/{name}: MIG reservations for containers {stray} it does not have")
    prio = priorities or {}
    grants = []
    for i, ctr in enumerate(container_names):
        entry = devices[i] if i < len(devices) else ()
        grants.append(
            ContainerGrant(
                name=ctr,
                devices=tuple(GrantedDevice(d.uuid, d.usedmem, d.usedcores) for d in entry),
                priority=prio.get(ctr),
                disable_control=ctr in disable_control,
                # an empty entry is a container already served (its entry erased): its instances live on
                # until the pod ends, but it has nothing left to allocate, so its reservations are not paired
                mig=pair_mig(
                    f"{namespace}/{name}",
                    ctr,
                    [d.uuid for d in entry],
                    [m for m in mig if m.container_index == i] if entry else (),
                ),
            )
        )
    return PodGrant(pod_uid=pod_uid, namespace=namespace, name=name, containers=tuple(grants))


# --- the builder -------------------------------------------------------------------------------------------


def _safe(text: str, what: str) -> str:
    if not _SAFE_NAME.fullmatch(text) or ".." in text:
        raise InvalidInput(f"{what} {text!r} cannot name a host path")
    return text


def _envs(grant: ContainerGrant, config: NodeAllocationConfig, cache_file: str) -> dict[str, str]:
    first = grant.devices[0]
    envs = {envvars.NVIDIA_VISIBLE_DEVICES: ",".join(dict.fromkeys(d.uuid for d in grant.devices))}
    for i, dev in enumerate(grant.devices):
        envs[envvars.memory_limit(i)] = f"{dev.usedmem_mib}{envvars.MEMORY_LIMIT_SUFFIX}"
    envs[envvars.CUDA_DEVICE_SM_LIMIT] = str(first.usedcores)
    envs[envvars.CUDA_DEVICE_MEMORY_SHARED_CACHE] = cache_file
    if config.device_memory_scaling > 1:
        envs[envvars.CUDA_OVERSUBSCRIBE] = "true"
    if config.libcuda_log_level:
        envs[envvars.LIBCUDA_LOG_LEVEL] = config.libcuda_log_level
    if config.disable_core_limit:
        envs[envvars.GPU_CORE_UTILIZATION_POLICY] = _POLICY_DISABLE
    elif config.core_policy.strip().lower() not in _POLICY_DEFAULT:
        envs[envvars.GPU_CORE_UTILIZATION_POLICY] = config.core_policy.strip().lower()
    if grant.priority is not None:
        envs[envvars.CUDA_TASK_PRIORITY] = str(grant.priority)
    return envs


def render_limits(envs: Mapping[str, str]) -> str:
    """The limits file: every value the interposer reads, one sorted ``KEY=VALUE`` line each, plus the two
    keys the file pins even where the environment leaves them unset (core policy, task priority)."""
    pinned = {
        envvars.GPU_CORE_UTILIZATION_POLICY: _POLICY_DEFAULT_WORD,
        envvars.CUDA_TASK_PRIORITY: str(DEFAULT_TASK_PRIORITY),
    }
    values = {**pinned, **envs}
    return "".join(f"{k}={v}\n" for k, v in sorted(values.items()) if k != envvars.NVIDIA_VISIBLE_DEVICES)


def task_priority(limits_content: str) -> int:
    """The container's allocated priority from its limits file, read as ``libvgpu.so`` reads it: trimmed
    ``KEY=VALUE`` lines, the last occurrence wins; absent or not an integer means the default (1)."""
    value = ""
    for line in limits_content.splitlines():
        key, sep, text = line.partition("=")
        if sep and key.strip() == envvars.CUDA_TASK_PRIORITY:
            value = text.strip()
    if not _INTEGER.fullmatch(value) or not _INT_MIN <= (number := int(value)) <= _INT_MAX:
        return DEFAULT_TASK_PRIORITY
    return number


def build_container(pod_uid: str, grant: ContainerGrant, config: NodeAllocationConfig) -> ContainerAllocation:
    """The Allocate answer for one container that was granted at least one device."""
    if not grant.devices:
        raise InvalidInput(f"container {grant.name} of pod {pod_uid} was granted no device")
    if grant.mig:
        # MIG: the device list is the instances' UUIDs, known once the plugin has created them (mig_answer)
        return ContainerAllocation(
            name=grant.name,
            device_uuids=tuple(d.uuid for d in grant.devices),
            response=ContainerResponse(envs={}),
            cache_dir="",
            limits_host_path="",
            limits_content="",
            mig=grant.mig,
        )
    slot = f"{_safe(pod_uid, 'pod UID')}_{_safe(grant.name, 'container name')}"
    vgpu = config.vgpu_dir
    cache_id = uuid.uuid5(_CACHE_NAMESPACE, slot)  # stable: a redelivered placement stages the same answer
    envs = _envs(grant, config, f"{vgpu}/{cache_id}.cache")
    cache_dir = f"{vgpu}/containers/{slot}"
    limits_host_path = f"{(config.limits_host_dir or vgpu + '/limits').rstrip('/')}/{slot}"
    mounts = [
        Mount(
            container_path=f"{vgpu}/libvgpu.so",
            host_path=config.libvgpu_host_path or f"{vgpu}/libvgpu.so",
            read_only=True,
        ),
        Mount(container_path=vgpu, host_path=cache_dir),
        Mount(container_path=VGPU_LOCK_PATH, host_path=VGPU_LOCK_PATH),
    ]
    if not grant.disable_control:
        mounts.append(Mount(container_path=LD_SO_PRELOAD, host_path=f"{vgpu}/ld.so.preload", read_only=True))
    mounts.append(Mount(container_path=LIMITS_CONTAINER_PATH, host_path=limits_host_path, read_only=True))
    uuids = tuple(d.uuid for d in grant.devices)
    cdi = tuple(f"{config.cdi_kind}={u}" for u in dict.fromkeys(uuids)) if config.cdi_kind else ()
    return ContainerAllocation(
        name=grant.name,
        device_uuids=uuids,
        response=ContainerResponse(envs=envs, mounts=tuple(mounts), cdi_devices=cdi),
        cache_dir=cache_dir,
        limits_host_path=limits_host_path,
        limits_content=render_limits(envs),
    )


def mig_answer(
    allocation: ContainerAllocation, realised: Sequence[MigAllocation], config: NodeAllocationConfig
) -> ContainerAllocation:
    """A MIG container's answer once its instances exist: ``realised`` are its reservations with their
    runtime ids, in device order. The MIG UUIDs are the device list, as HAMi's plugin answers (§5.4);
    nothing of HAMi-core (no limits, no interposer, no host files): the hardware partition is the limit."""
    expected = [(m.device_index, m.gpu_uuid, m.profile, m.placement) for m in allocation.mig]
    got = [(m.device_index, m.gpu_uuid, m.profile, m.placement) for m in realised]
    if not allocation.mig or got != expected or not all(m.mig_uuid for m in realised):
        raise InvalidInput(f"container {allocation.name}: the instances created do not match its MIG reservations")
    mig_uuids = tuple(m.mig_uuid for m in realised if m.mig_uuid)
    envs = {envvars.NVIDIA_VISIBLE_DEVICES: ",".join(mig_uuids)}
    cdi = tuple(f"{config.cdi_kind}={u}" for u in mig_uuids) if config.cdi_kind else ()
    return msgspec.structs.replace(
        allocation, response=ContainerResponse(envs=envs, cdi_devices=cdi), mig=tuple(realised)
    )


def build_pod(grant: PodGrant, config: NodeAllocationConfig) -> tuple[ContainerAllocation, ...]:
    """One answer per container that has devices, in HAMi order: the kubelet asks only for those."""
    return tuple(build_container(grant.pod_uid, c, config) for c in grant.containers if c.devices)
