"""The kubelet emulator checks registrations as the kubelet does (k8s-interfaces §1.4)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from hami_allocator.inventory import DeclaredInventory
from hami_common.allocation import NodeAllocationConfig
from hami_common.deviceplugin.rpc import VERSION, RegistrationClient, pb, unix_target
from hami_common.resources import GPU
from hami_common.staging import StagingStore
from hami_sim.kubelet import KubeletEmulator
from tests.allocator.conftest import GPUS, SPLIT, pod_object, running_allocator


async def _register(sockdir: Path, request: pb.RegisterRequest) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(unix_target(str(sockdir / "kubelet.sock"))) as channel:
        try:
            await RegistrationClient(channel).register(request, deadline=5.0)
        except grpc.aio.AioRpcError as err:
            return err.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        pytest.param(
            pb.RegisterRequest(version="v1alpha", endpoint="x.sock", resource_name=GPU),
            grpc.StatusCode.INVALID_ARGUMENT,
            id="an unsupported version is refused",
        ),
        pytest.param(
            pb.RegisterRequest(version=VERSION, endpoint="x.sock", resource_name="gpu"),
            grpc.StatusCode.INVALID_ARGUMENT,
            id="a resource that is not an extended resource is refused",
        ),
        pytest.param(
            pb.RegisterRequest(version=VERSION, endpoint="x.sock", resource_name="kubernetes.io/gpu"),
            grpc.StatusCode.INVALID_ARGUMENT,
            id="the kubernetes.io domain is refused",
        ),
        pytest.param(
            pb.RegisterRequest(version=VERSION, endpoint="absent.sock", resource_name=GPU),
            grpc.StatusCode.UNAVAILABLE,
            id="a plugin that cannot be dialled back is refused",
        ),
    ],
)
async def test_registration_is_checked_like_the_kubelets(
    sockdir: Path, request_: pb.RegisterRequest, code: grpc.StatusCode
) -> None:
    async with KubeletEmulator(sockdir, dial_timeout=0.3) as kubelet:
        assert await _register(sockdir, request_) == code
    assert kubelet.registrations == 0


async def test_a_pod_asking_more_than_is_free_is_not_admitted(
    sockdir: Path, store: StagingStore, alloc_config: NodeAllocationConfig, inventory: DeclaredInventory
) -> None:
    async with (
        KubeletEmulator(sockdir) as kubelet,
        running_allocator(sockdir, store=store, config=alloc_config, inventory=inventory),
    ):
        await kubelet.wait_devices(GPU, len(GPUS) * SPLIT)
        admission = await kubelet.admit(pod_object("uid-big", "big", {"main": len(GPUS) * SPLIT + 1}))
    assert not admission.ok
    assert "available" in admission.containers[0].error
