"""The grant signature over a MIG grant (hami_common.grants): it covers what the scheduler wrote in
``hami.io/vgpu-mig-allocations`` (container, device, GPU, profile, placement), not the runtime ids the device
plugin adds after Allocate."""

from __future__ import annotations

import msgspec
import pytest

from hami_common.annotations import (
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    GRANT_SIGNATURE,
    MIG_ALLOCATIONS,
    VGPU_NODE,
    MigAllocation,
    encode_mig_allocations,
)
from hami_common.grants import unverified_reason
from tests.allocator.conftest import GRANT_KEY
from tests.allocator.mig_support import reservation

UID = "uid-mig"
NODE = "gpu-node-1"
GPU = "GPU-11111111-2222-3333-4444-555555555555"
DEVICES = f"{GPU},NVIDIA,4864,14:;"
SIGNED = reservation(0, 0, GPU, "1g.5gb", 6, 1)


def grant_annotations(mig: list[MigAllocation], *, signed_over: list[MigAllocation] | None = None) -> dict[str, str]:
    return {
        VGPU_NODE: NODE,
        DEVICES_ALLOCATED: DEVICES,
        DEVICES_TO_ALLOCATE: DEVICES,
        MIG_ALLOCATIONS: encode_mig_allocations(mig),
        GRANT_SIGNATURE: GRANT_KEY.sign(UID, NODE, DEVICES, signed_over if signed_over is not None else mig),
    }


def test_the_annotation_as_the_scheduler_wrote_it_verifies() -> None:
    assert unverified_reason(GRANT_KEY, UID, grant_annotations([SIGNED])) == ""


def test_it_still_verifies_once_the_device_plugin_has_added_the_runtime_ids() -> None:
    patched = msgspec.structs.replace(SIGNED, mig_uuid="MIG-abc", gpu_instance_id=13, compute_instance_id=0)
    assert unverified_reason(GRANT_KEY, UID, grant_annotations([patched], signed_over=[SIGNED])) == ""


@pytest.mark.parametrize(
    "tampered",
    [
        pytest.param(reservation(0, 0, GPU, "7g.40gb", 0, 8), id="profile and placement"),
        pytest.param(reservation(0, 0, GPU, "1g.5gb", 5, 1), id="placement only"),
        pytest.param(reservation(0, 0, "GPU-other", "1g.5gb", 6, 1), id="another GPU"),
        pytest.param(reservation(1, 0, GPU, "1g.5gb", 6, 1), id="another container"),
    ],
)
def test_a_changed_reservation_does_not_verify(tampered: MigAllocation) -> None:
    reason = unverified_reason(GRANT_KEY, UID, grant_annotations([tampered], signed_over=[SIGNED]))
    assert "signature does not match" in reason


def test_adding_or_dropping_reservations_does_not_verify() -> None:
    extra = reservation(0, 1, GPU, "1g.5gb", 5, 1)
    assert unverified_reason(GRANT_KEY, UID, grant_annotations([SIGNED, extra], signed_over=[SIGNED])) != ""
    dropped = grant_annotations([SIGNED])
    del dropped[MIG_ALLOCATIONS]
    assert "signature does not match" in unverified_reason(GRANT_KEY, UID, dropped)


def test_reservations_added_to_a_plain_grant_do_not_verify_and_plain_grants_are_unchanged() -> None:
    plain = {VGPU_NODE: NODE, DEVICES_ALLOCATED: DEVICES, GRANT_SIGNATURE: GRANT_KEY.sign(UID, NODE, DEVICES)}
    assert unverified_reason(GRANT_KEY, UID, plain) == ""
    forged = {**plain, MIG_ALLOCATIONS: encode_mig_allocations([SIGNED])}
    assert "signature does not match" in unverified_reason(GRANT_KEY, UID, forged)


def test_an_undecodable_reservation_list_is_refused_with_its_reason() -> None:
    broken = {**grant_annotations([SIGNED]), MIG_ALLOCATIONS: '[{"containerIndex":0}]'}
    assert "MIG reservations do not decode" in unverified_reason(GRANT_KEY, UID, broken)
