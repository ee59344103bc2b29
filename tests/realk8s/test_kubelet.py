"""The real kubelet's device manager and our allocator: registration, ListAndWatch, Allocate, the container.

The kubelet v1.37 (on the fake CRI runtime of k8s.io/cri-client) registers as Node ``n1`` with the real
kube-apiserver as ``system:node:n1``; our allocator registers with it as the device plugin of
``nvidia.com/gpu``; a pod bound to the node the way the extender binds it is admitted by the kubelet, which
asks the allocator to ``Allocate`` and creates the container with the answer.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami_allocator.settings import AllocatorSettings
from hami_common import envvars
from hami_common.allocation import ContainerGrant, GrantedDevice, NodeAllocationConfig, PodGrant, build_pod
from hami_common.annotations import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    BIND_PHASE_SUCCESS,
    BIND_TIME,
    DEVICES_ALLOCATED,
    DEVICES_TO_ALLOCATE,
    GRANT_SIGNATURE,
    VGPU_NODE,
    ContainerDevice,
    encode_pod_devices,
)
from hami_common.grants import GrantKey
from hami_common.inventory import FAKE
from hami_common.resources import GPU
from hami_common.settings import to_argv
from hami_common.staging import StagedPod, StagingStore
from hami_sim.realk8s import ApiError, ControlPlane, Peer, RealKubelet, mount_namespaces_work

NODE = "n1"
GPUS = ("GPU-5e4f0c1a-0000-4000-8000-000000000001", "GPU-5e4f0c1a-0000-4000-8000-000000000002")
SPLIT = 4
KEY = GrantKey(b"the extender's grant key, shared with the allocator")
_ALLOCATOR_MAIN = "import sys; from hami_allocator.main import main; sys.exit(main(sys.argv[1:]))"

pytestmark = pytest.mark.skipif(
    not mount_namespaces_work(), reason="the real kubelet needs a private mount namespace (root, unshare --mount)"
)


def until(what: str, check: Any, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} not within {timeout:.0f} s")


@pytest.fixture
def node(plane: ControlPlane, tmp_path: Path) -> Iterator[RealKubelet]:
    """A real kubelet for node n1 and our allocator registered with it (fake inventory, fallback path only)."""
    kubelet = RealKubelet(plane, NODE, tmp_path / NODE)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "nodes": {
                    NODE: [
                        {"uuid": u, "index": i, "model": "NVIDIA A100", "memory_mib": 40960} for i, u in enumerate(GPUS)
                    ]
                }
            }
        )
    )
    key_file = tmp_path / "grant-key"
    key_file.write_bytes(KEY.secret)
    settings = AllocatorSettings(
        kubeconfig=str(plane.write_kubeconfig(tmp_path / "admin")),
        grant_key_file=str(key_file),
        node_name=NODE,
        plugin_dir=str(kubelet.plugin_dir),
        device_split_count=SPLIT,
        inventory=FAKE,
        fake_inventory=str(inventory),
        staging_dir=str(tmp_path / "staging"),
        hook_path=str(tmp_path / "hook"),
        use_bus=False,
        pod_resources_socket=str(kubelet.pod_resources_socket),
    )
    allocator = Peer(
        "allocator", [sys.executable, "-c", _ALLOCATOR_MAIN, *to_argv(settings)], tmp_path / "allocator.log"
    )
    kubelet.start()
    try:
        until("Node n1 registered by its kubelet", lambda: _node(plane))
        allocator.start()
        yield kubelet
    finally:
        allocator.stop()
        kubelet.stop()
        _forget_node(plane)
        print("kubelet:", kubelet.kubelet.tail(20), "\nallocator:", allocator.tail(20))


def _forget_node(plane: ControlPlane) -> None:
    """Remove the node and its pods, so the next test's kubelet registers afresh (its allocatable starts at 0)."""
    pods = plane.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={NODE}")
    for pod in pods.get("items", []):
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        plane.request("DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    plane.request("DELETE", f"/api/v1/nodes/{NODE}")


def _node(plane: ControlPlane) -> dict[str, Any] | None:
    try:
        return plane.request("GET", f"/api/v1/nodes/{NODE}")
    except ApiError:
        return None


@pytest.mark.timeout(240)
def test_the_real_kubelet_registers_our_plugin_calls_allocate_and_creates_the_container_with_its_answer(
    plane: ControlPlane, node: RealKubelet
) -> None:
    def advertised() -> int:
        found = _node(plane) or {}
        return int(found.get("status", {}).get("allocatable", {}).get(GPU, "0"))

    # registration and ListAndWatch: the kubelet's device manager advertises what our plugin lists
    assert until("nvidia.com/gpu allocatable", advertised) == len(GPUS) * SPLIT

    grant = encode_pod_devices([[ContainerDevice(uuid=GPUS[0], type="NVIDIA", usedmem=3000, usedcores=30)]])
    plane.ensure_namespace("kubelet-check")
    pod = plane.create("", "v1", "pods", "kubelet-check", _gpu_pod("gpu-pod", grant, node_name=""))
    # as the extender does: sign the grant in Filter, then bind with the Binding subresource
    signed = {"metadata": {"annotations": {GRANT_SIGNATURE: KEY.sign(pod["metadata"]["uid"], NODE, grant)}}}
    plane.request("PATCH", "/api/v1/namespaces/kubelet-check/pods/gpu-pod", signed, "application/merge-patch+json")
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "gpu-pod"}, "target": {"name": NODE}}
    plane.request("POST", "/api/v1/namespaces/kubelet-check/pods/gpu-pod/binding", binding)

    def phase() -> str:
        got = plane.request("GET", "/api/v1/namespaces/kubelet-check/pods/gpu-pod")
        return str(got.get("status", {}).get("phase", "")) if got.get("status", {}).get("phase") != "Pending" else ""

    assert until("the pod started by the kubelet", phase) == "Running"
    (created,) = [c for c in node.created_containers() if c["container"] == "main"]
    envs = {e["key"]: e["value"] for e in created["envs"]}
    assert envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[0]
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert any(m["container_path"] == "/etc/ld.so.preload" for m in created["mounts"])
    stored = plane.request("GET", "/api/v1/namespaces/kubelet-check/pods/gpu-pod")
    assert stored["metadata"]["annotations"][BIND_PHASE] == BIND_PHASE_SUCCESS


@pytest.mark.timeout(240)
def test_the_real_kubelet_gets_no_devices_for_a_grant_the_scheduler_did_not_sign(
    plane: ControlPlane, node: RealKubelet
) -> None:
    """HAMi#3041: a pod created straight onto the node with a forged 80000 MiB grant (no webhook registered
    here, as when admission skips a pod). The kubelet asks our allocator, which refuses: the pod fails
    admission and no container is ever created, where HAMi's plugin would have started it unlimited."""
    until("nvidia.com/gpu allocatable", lambda: (_node(plane) or {}).get("status", {}).get("allocatable", {}).get(GPU))
    forged = encode_pod_devices([[ContainerDevice(uuid=GPUS[0], type="NVIDIA", usedmem=80000, usedcores=100)]])
    body = _gpu_pod("forged", forged, node_name=NODE)
    body["metadata"]["annotations"][GRANT_SIGNATURE] = KEY.sign("some-other-pod-uid", NODE, forged)
    plane.ensure_namespace("kubelet-forged")
    plane.create("", "v1", "pods", "kubelet-forged", body)

    def settled() -> dict[str, Any] | None:
        got = plane.request("GET", "/api/v1/namespaces/kubelet-forged/pods/forged")
        return got if got.get("status", {}).get("phase") in ("Failed", "Running") else None

    status = until("the kubelet's verdict on the forged pod", settled)["status"]
    assert status["phase"] == "Failed"
    assert status.get("reason") == "UnexpectedAdmissionError"
    assert "signature does not match" in status.get("message", "")
    assert not [c for c in node.created_containers() if c["container"] == "main"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("thief_first", [True, False], ids=["thief-admitted-first", "rightful-admitted-first"])
def test_a_pod_without_a_grant_is_never_handed_the_grant_of_another_pod_on_the_node(
    plane: ControlPlane, node: RealKubelet, tmp_path: Path, thief_first: bool
) -> None:
    """Issue 28 item 1b. The device plugin API does not say which pod an Allocate is for; HAMi serves the
    oldest pending grant to whoever asks. Here a pod that asks for a GPU but holds no grant (created onto the
    node directly: no webhook, no scheduler) is admitted while another pod's signed grant waits staged on the
    node. The allocator asks the kubelet's PodResources List which pod it is admitting: the thief is refused,
    the rightful pod gets its own grant, in either order."""
    until("nvidia.com/gpu allocatable", lambda: (_node(plane) or {}).get("status", {}).get("allocatable", {}).get(GPU))
    plane.ensure_namespace("kubelet-swap")
    grant = encode_pod_devices([[ContainerDevice(uuid=GPUS[1], type="NVIDIA", usedmem=5000, usedcores=50)]])
    rightful = plane.create("", "v1", "pods", "kubelet-swap", _gpu_pod("rightful", grant, node_name=""))
    uid = rightful["metadata"]["uid"]
    signed = {"metadata": {"annotations": {GRANT_SIGNATURE: KEY.sign(uid, NODE, grant)}}}
    plane.request("PATCH", "/api/v1/namespaces/kubelet-swap/pods/rightful", signed, "application/merge-patch+json")
    # what the node agent stages from the extender's placement, before the pod is bound
    placed = PodGrant(
        pod_uid=uid,
        namespace="kubelet-swap",
        name="rightful",
        containers=(ContainerGrant(name="main", devices=(GrantedDevice(GPUS[1], 5000, 50),)),),
    )
    staged = StagedPod(
        pod_uid=uid,
        namespace="kubelet-swap",
        name="rightful",
        node=NODE,
        bind_time_ns=time.time_ns(),
        containers=build_pod(placed, NodeAllocationConfig(hook_path=str(tmp_path / "hook"))),
    )
    assert StagingStore(tmp_path / "staging").put(staged)

    def phase(name: str) -> str:
        got = plane.request("GET", f"/api/v1/namespaces/kubelet-swap/pods/{name}")
        found = str(got.get("status", {}).get("phase", ""))
        return found if found in ("Running", "Failed") else ""

    def bind_rightful() -> None:
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "rightful"}, "target": {"name": NODE}}
        plane.request("POST", "/api/v1/namespaces/kubelet-swap/pods/rightful/binding", binding)
        assert until("the rightful pod admitted", lambda: phase("rightful")) == "Running"

    def create_thief() -> None:
        thief = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "thief"},
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": {GPU: "1"}}}],
            },
        }
        plane.create("", "v1", "pods", "kubelet-swap", thief)
        assert until("the thief's admission settled", lambda: phase("thief")) == "Failed"

    for step in (create_thief, bind_rightful) if thief_first else (bind_rightful, create_thief):
        step()
    thief = plane.request("GET", "/api/v1/namespaces/kubelet-swap/pods/thief")
    assert thief["status"].get("reason") == "UnexpectedAdmissionError"
    assert "holds no grant" in thief["status"].get("message", "")
    created = [c for c in node.created_containers() if c["container"] == "main"]
    assert [c["pod"]["name"] for c in created] == ["rightful"]  # the thief got no container
    (main,) = created
    envs = {e["key"]: e["value"] for e in main["envs"]}
    assert envs[envvars.NVIDIA_VISIBLE_DEVICES] == GPUS[1]
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5000m"
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "50"


def _gpu_pod(name: str, grant: str, *, node_name: str) -> dict[str, Any]:
    """A GPU pod carrying the annotations Filter writes (bind-phase and time as Bind leaves them)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {VGPU_NODE: NODE},
            "annotations": {
                VGPU_NODE: NODE,
                BIND_TIME: str(int(time.time())),
                BIND_PHASE: BIND_PHASE_ALLOCATING,
                DEVICES_TO_ALLOCATE: grant,
                DEVICES_ALLOCATED: grant,
            },
        },
        "spec": {
            **({"nodeName": node_name} if node_name else {}),
            "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": {GPU: "1"}}}],
        },
    }
