"""What a prepared claim gives its container: an allocated ResourceClaim → HAMi-core's answer → a CDI spec (pure).

The first piece of the kubelet plugin's NodePrepareResources (issue 32 item 1; spec dra.md §1.2, §2.4): the
plugin reads the claim's allocation (the devices of this node's pool and the capacity each share consumes),
and the container must get what HAMi-core reads in device-plugin mode: ``NVIDIA_VISIBLE_DEVICES``, the memory
limit per device, the core limit, the shared cache, ``libvgpu.so`` and ``ld.so.preload``. So the allocation is
turned into the same :class:`~hami_common.allocation.ContainerGrant` the device plugin answers from, and
:func:`~hami_common.allocation.build_container` builds the answer: one implementation of HAMi-core's contract
for both modes. A claim is one container's (the webhook writes one claim entry per container), so the claim's
UID stands where device-plugin mode has the pod's: it names the cache directory and the limits file.

:func:`cdi_spec` writes that answer as a Container Device Interface spec, one CDI device per claim, named
after the claim's UID (runtimes cache specs by name). The gRPC service, the checkpoint and the host files
(cache directory, limits file; :class:`~hami_common.allocation.ContainerAllocation` describes them) are the
plugin's, not this module's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import msgspec

from hami_common.allocation import ContainerAllocation, ContainerGrant, GrantedDevice
from hami_common.dra.names import CAPACITY_CORES, CAPACITY_MEMORY, DRIVER
from hami_common.errors import InvalidInput
from hami_common.quantity import value

__all__ = [
    "CDI_KIND",
    "CDI_VERSION",
    "AllocatedClaim",
    "CdiSpec",
    "cdi_device_id",
    "cdi_spec",
    "claim_grant",
]

CDI_VERSION: Final = "0.6.0"
CDI_KIND: Final = f"{DRIVER}/claim"  # <vendor>/<class>: one CDI device per prepared claim
_MIB: Final = 1 << 20


class _Result(msgspec.Struct, frozen=True, rename="camel"):
    request: str
    driver: str
    pool: str
    device: str
    consumed_capacity: dict[str, str] = msgspec.field(default_factory=dict)


class _DeviceAllocation(msgspec.Struct, frozen=True):
    results: tuple[_Result, ...] = ()


class _Allocation(msgspec.Struct, frozen=True):
    devices: _DeviceAllocation = msgspec.field(default_factory=_DeviceAllocation)


class _ClaimStatus(msgspec.Struct, frozen=True):
    allocation: _Allocation | None = None


class _ClaimMeta(msgspec.Struct, frozen=True):
    name: str
    namespace: str
    uid: str


class AllocatedClaim(msgspec.Struct, frozen=True):
    """The fields of a ``resource.k8s.io/v1`` ResourceClaim the plugin reads (decode the apiserver's JSON)."""

    metadata: _ClaimMeta
    status: _ClaimStatus = msgspec.field(default_factory=_ClaimStatus)


def claim_grant(claim: AllocatedClaim, node: str, uuids: Mapping[str, str]) -> ContainerGrant:
    """The grant of ``claim`` on ``node``: one device per allocation result of HAMi's driver, with the memory
    (MiB) and cores the share consumes; ``uuids`` maps this node's published device names to GPU UUIDs.

    Results of other drivers are not ours to prepare and are skipped. InvalidInput when the claim is not
    allocated, names another node's pool or a device this node does not publish, or consumes no capacity
    (a claim of this class always consumes some: the device's defaults when it asks none)."""
    where = f"claim {claim.metadata.namespace}/{claim.metadata.name}"
    if claim.status.allocation is None:
        raise InvalidInput(f"{where} is not allocated")
    devices = []
    for result in claim.status.allocation.devices.results:
        if result.driver != DRIVER:
            continue
        if result.pool != node:
            raise InvalidInput(f"{where} is allocated {result.device} of node {result.pool}, not of {node}")
        if result.device not in uuids:
            raise InvalidInput(f"{where} is allocated {result.device}, which {node} does not publish")
        consumed = result.consumed_capacity
        if CAPACITY_MEMORY not in consumed or CAPACITY_CORES not in consumed:
            raise InvalidInput(f"{where} consumes no memory or cores of {result.device}: not a shared GPU")
        devices.append(
            GrantedDevice(
                uuid=uuids[result.device],
                usedmem_mib=value(consumed[CAPACITY_MEMORY]) // _MIB,
                usedcores=value(consumed[CAPACITY_CORES]),
            )
        )
    if not devices:
        raise InvalidInput(f"{where} has no device of {DRIVER}")
    # the container's name in device-plugin mode; here the claim's request (``gpu``), the claim being the
    # container's own
    request = next(r.request for r in claim.status.allocation.devices.results if r.driver == DRIVER)
    return ContainerGrant(name=request, devices=tuple(devices))


# --- CDI ------------------------------------------------------------------------------------------------


class CdiMount(msgspec.Struct, frozen=True, rename="camel"):
    host_path: str
    container_path: str
    options: tuple[str, ...]


class CdiEdits(msgspec.Struct, frozen=True):
    env: tuple[str, ...]  # KEY=VALUE
    mounts: tuple[CdiMount, ...]


class CdiDevice(msgspec.Struct, frozen=True, rename="camel"):
    name: str
    container_edits: CdiEdits


class CdiSpec(msgspec.Struct, frozen=True, rename="camel"):
    cdi_version: str
    kind: str
    devices: tuple[CdiDevice, ...]


def cdi_device_id(claim_uid: str) -> str:
    """The fully qualified CDI name the kubelet passes to the runtime (``<kind>=<name>``)."""
    return f"{CDI_KIND}={claim_uid}"


def cdi_spec(claim_uid: str, allocation: ContainerAllocation) -> CdiSpec:
    """``allocation``'s environment and mounts as one CDI device named after the claim."""
    response = allocation.response
    mounts = tuple(
        CdiMount(
            host_path=m.host_path,
            container_path=m.container_path,
            options=("ro" if m.read_only else "rw", "nosuid", "nodev", "bind"),
        )
        for m in response.mounts
    )
    env = tuple(f"{key}={val}" for key, val in sorted(response.envs.items()))
    device = CdiDevice(name=claim_uid, container_edits=CdiEdits(env=env, mounts=mounts))
    return CdiSpec(cdi_version=CDI_VERSION, kind=CDI_KIND, devices=(device,))
