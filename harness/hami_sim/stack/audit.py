"""Workloads for the stack, and the audit that says whether what every layer believes agrees.

:func:`gpu_pod` and :func:`mixed_workload` build pod manifests; :func:`audit` compares, for every
allocated pod, the devices annotated by the extender with what the kubelet's ``Allocate`` calls
answered, and checks that no GPU is over-committed (memory, cores, slots).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami_common import envvars
from hami_common.annotations import DEVICES_ALLOCATED, ContainerDevice, decode_pod_devices
from hami_common.errors import AnnotationError
from hami_common.kube import Container, Pod
from hami_common.resources import GPU, GPU_CORES, GPU_MEMORY, GPU_MEMORY_PERCENTAGE
from hami_sim.stack._node import Admitted

__all__ = ["AuditReport", "GpuCapacity", "audit", "gpu_pod", "mixed_workload", "usage_by_gpu"]

Json = dict[str, Any]
_FULL_CORES = 100


def gpu_pod(
    name: str,
    *,
    gpus: int = 1,
    mem: int | None = None,
    mem_percent: int | None = None,
    cores: int | None = None,
    namespace: str = "default",
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Json:
    """A one-container pod asking for a GPU slice, as a user would write it (no scheduler named)."""
    limits = {GPU: str(gpus)}
    if mem is not None:
        limits[GPU_MEMORY] = str(mem)
    if mem_percent is not None:
        limits[GPU_MEMORY_PERCENTAGE] = str(mem_percent)
    if cores is not None:
        limits[GPU_CORES] = str(cores)
    metadata: Json = {"name": name, "namespace": namespace, "annotations": dict(annotations or {})}
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]},
    }


def mixed_workload(count: int, *, seed: int = 7, prefix: str = "job") -> list[Json]:
    """``count`` pods mixing memory by MiB and by percentage, cores, and a few two-GPU pods; labelled
    ``app=<prefix>``, as the pods of a Deployment or a Job are (a pod without labels costs the scheduler
    one more write: see hami_extender.placer)."""
    rng = random.Random(seed)
    labels = {"app": prefix}
    pods = []
    for i in range(count):
        kind = i % 5
        name = f"{prefix}-{i:04d}"
        if kind == 0:
            pods.append(gpu_pod(name, mem=rng.choice((1024, 2048, 4096)), cores=rng.choice((10, 20)), labels=labels))
        elif kind == 1:
            pods.append(gpu_pod(name, mem_percent=rng.choice((5, 10, 15)), labels=labels))
        elif kind == 2:
            pods.append(gpu_pod(name, mem=rng.choice((3000, 6000)), cores=rng.choice((5, 10, 15)), labels=labels))
        elif kind == 3:
            pods.append(gpu_pod(name, gpus=2, mem=rng.choice((1000, 2000)), cores=10, labels=labels))
        else:
            pods.append(gpu_pod(name, mem=rng.choice((500, 1500, 2500)), labels=labels))
    return pods


@dataclass(frozen=True, slots=True)
class GpuCapacity:
    memory_mib: int
    slots: int
    cores: int = _FULL_CORES


@dataclass(slots=True)
class AuditReport:
    allocated: int = 0
    problems: list[str] = field(default_factory=list)


def _allocated(pod: Pod) -> tuple[tuple[ContainerDevice, ...], ...] | None:
    value = pod.metadata.annotations.get(DEVICES_ALLOCATED)
    if not value:
        return None
    try:
        return decode_pod_devices(value, DEVICES_ALLOCATED)
    except AnnotationError:
        return None


def usage_by_gpu(pods: Iterable[Pod]) -> dict[str, tuple[int, int, int]]:
    """GPU UUID -> (MiB, cores, containers) summed over every pod's allocated-devices annotation."""
    usage: dict[str, tuple[int, int, int]] = {}
    for pod in pods:
        for container in _allocated(pod) or ():
            for dev in container:
                mem, cores, n = usage.get(dev.uuid, (0, 0, 0))
                usage[dev.uuid] = (mem + dev.usedmem, cores + dev.usedcores, n + 1)
    return usage


def _check_container(
    pod: Pod, container: Container, devices: Sequence[ContainerDevice], admitted: Admitted
) -> list[str]:
    where = f"{pod.metadata.namespace}/{pod.metadata.name}/{container.name}"
    if not devices:
        return []
    answer = next((c for c in admitted.admission.containers if c.name == container.name), None)
    if answer is None or answer.error:
        return [f"{where}: no Allocate answer ({answer.error if answer else 'not asked'})"]
    envs = answer.envs
    want = {envvars.NVIDIA_VISIBLE_DEVICES: ",".join(dict.fromkeys(d.uuid for d in devices))}
    for i, dev in enumerate(devices):
        want[envvars.memory_limit(i)] = f"{dev.usedmem}{envvars.MEMORY_LIMIT_SUFFIX}"
    want[envvars.CUDA_DEVICE_SM_LIMIT] = str(devices[0].usedcores)
    return [
        f"{where}: {key}={envs.get(key)!r}, annotated {value!r}"
        for key, value in want.items()
        if envs.get(key) != value
    ]


def audit(pods: Iterable[Pod], admitted: Mapping[str, Admitted], capacity: Mapping[str, GpuCapacity]) -> AuditReport:
    """Every allocated pod's Allocate answers against its annotation, and every GPU against its capacity."""
    report = AuditReport()
    listed = list(pods)
    for pod in listed:
        granted = _allocated(pod)
        got = admitted.get(pod.metadata.uid)
        if granted is None or got is None:
            continue
        report.allocated += 1
        if got.node != pod.spec.node_name:
            report.problems.append(f"{pod.metadata.name}: admitted on {got.node}, bound to {pod.spec.node_name}")
        # the annotation lists the init containers first, then the app containers (HAMi's order)
        containers = (*pod.spec.init_containers, *pod.spec.containers)
        for container, devices in zip(containers, granted, strict=False):
            report.problems.extend(_check_container(pod, container, devices, got))
    for uuid, (mem, cores, n) in usage_by_gpu(p for p in listed if p.metadata.uid in admitted).items():
        cap = capacity.get(uuid)
        if cap is None:
            report.problems.append(f"{uuid}: granted but no such GPU")
        elif mem > cap.memory_mib or cores > cap.cores or n > cap.slots:
            report.problems.append(f"{uuid}: over-committed: {mem} MiB, {cores}% cores, {n} containers")
    return report
