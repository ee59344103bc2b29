"""MIG reservations ``hami.io/vgpu-mig-allocations`` (hami-protocol §2.6).

JSON array of ``{"containerIndex","deviceIndex","gpuUUID","profile","placement":{"start","size"}}``; the
device plugin later adds ``migUUID``, ``gpuInstanceID`` and ``computeInstanceID`` — all three or none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Final

import msgspec

from hami_common.annotations.keys import MIG_ALLOCATIONS
from hami_common.annotations.registration import MigPlacement
from hami_common.errors import AnnotationError

__all__ = ["MigAllocation", "decode_mig_allocations", "encode_mig_allocations"]

_Index = Annotated[int, msgspec.Meta(ge=0)]


class MigAllocation(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    omit_defaults=True,
    rename={
        "container_index": "containerIndex",
        "device_index": "deviceIndex",
        "gpu_uuid": "gpuUUID",
        "mig_uuid": "migUUID",
        "gpu_instance_id": "gpuInstanceID",
        "compute_instance_id": "computeInstanceID",
    },
):
    container_index: _Index
    device_index: _Index
    gpu_uuid: str
    profile: str
    placement: MigPlacement
    mig_uuid: str | None = None
    gpu_instance_id: _Index | None = None
    compute_instance_id: _Index | None = None

    @property
    def realised(self) -> bool:
        """Whether the device plugin has created the instance and recorded its ids."""
        return self.mig_uuid is not None


_DECODER: Final = msgspec.json.Decoder(tuple[MigAllocation, ...])
_ENCODER: Final = msgspec.json.Encoder()


def encode_mig_allocations(allocations: Sequence[MigAllocation]) -> str:
    return _ENCODER.encode(tuple(allocations)).decode()


def decode_mig_allocations(value: str, key: str = MIG_ALLOCATIONS) -> tuple[MigAllocation, ...]:
    try:
        allocations = _DECODER.decode(value)
    except msgspec.DecodeError as err:
        raise AnnotationError(key, f"not a valid MIG allocation list: {err}") from err
    for entry in allocations:
        runtime = (entry.mig_uuid, entry.gpu_instance_id, entry.compute_instance_id)
        if any(v is not None for v in runtime) and not all(v is not None for v in runtime):
            raise AnnotationError(
                key, f"entry for {entry.gpu_uuid}: migUUID, gpuInstanceID and computeInstanceID come all three or none"
            )
    return allocations
