"""``hami status``: the device overview of a cluster, the local stack's or any other, every vendor included.

Everything booked comes from the apiserver, the source of truth, read through each device family's port
(:class:`~hami_cli.report.Fleet`): the nodes' registrations (devices, memory, slices), the pods' device lists
(who holds what) and the ``FailedScheduling`` Events of pending pods (why they wait). What is *used* comes
from the metrics service when it answers (HAMi's ``hami_host_gpu_*`` families); without it those columns
say ``-``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from hami_cli.helpfmt import DefaultsHelp
from hami_cli.report import Fleet, Grant, pending_reasons, render_table, short_uuid
from hami_cli.state import add_dir_flag, pick_running
from hami_common.annotations import BIND_PHASE, MIG_ALLOCATIONS, MigAllocation, decode_mig_allocations
from hami_common.annotations.registration import MODE_MIG
from hami_common.deviceconfig import DeviceConfig, read_device_config
from hami_common.errors import AnnotationError, HamiError, TransientError
from hami_common.kube import FAILED_SCHEDULING, Event, KubeClient, KubeSettings, Node, Pod
from hami_common.scheduling.policy import DEFAULT_SCHEDULER_NAME
from hami_common.service import run_loop
from hami_common.vendors.plugin import fake_vendors
from hami_common.vendors.registry import configured
from hami_metrics.families import HOST_MEMORY_USED, HOST_UTILIZATION

__all__ = [
    "GpuRow",
    "MigRow",
    "Overview",
    "PodRow",
    "build_overview",
    "default_fleet",
    "parse_usage",
    "parser",
    "render_overview",
    "status_main",
]

_MIB = 1024 * 1024
_METRICS_TIMEOUT_S: Final = 3.0
WAITING = "waiting to be scheduled"
FAILED = "Failed"
UNREADABLE = "Unreadable"


class MigRow(msgspec.Struct, frozen=True, kw_only=True):
    """One MIG instance booked on a card: its profile and placement, and the device once it exists."""

    profile: str
    start: int
    size: int
    pod: str
    mig_uuid: str = ""  # empty until the device plugin has created the instance


class GpuRow(msgspec.Struct, frozen=True, kw_only=True):
    node: str
    vendor: str  # the device family's common word: NVIDIA, Ascend910B, MLU, DCU, ...
    uuid: str
    type: str
    memory_mib: int
    memory_booked_mib: int
    memory_used_mib: int | None  # None: the metrics service did not answer or has no sample yet
    cores_booked: int
    core_utilization: float | None
    slices: int
    slices_booked: int
    pods: list[str]
    mode: str = ""  # "mig" for a card cut into MIG instances
    instances: list[MigRow] = msgspec.field(default_factory=list)


class PodRow(msgspec.Struct, frozen=True, kw_only=True):
    pod: str
    node: str  # "" while pending
    devices: list[str]  # uuid(memMiB,cores%) per granted device
    state: str  # the bind phase once bound, "Pending" before; "Failed"; "Unreadable": its request is not
    reason: str = ""  # why a pending pod waits, a failed pod failed, or a request cannot be read


class Overview(msgspec.Struct, frozen=True, kw_only=True):
    cluster: str  # the API server's URL
    gpus: list[GpuRow]
    pods: list[PodRow]
    metrics_url: str = ""
    metrics: str = ""  # "ok", or why the used columns are empty


class Usage(msgspec.Struct, frozen=True):
    memory_mib: dict[str, int]  # device uuid -> MiB in use
    utilization: dict[str, float]  # device uuid -> core utilisation, 0-100


def parse_usage(text: str) -> Usage:
    """The per-GPU usage in a Prometheus exposition of the metrics service (unknown families ignored)."""
    memory: dict[str, int] = {}
    util: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            uuid = sample.labels.get("device_uuid", "")
            if not uuid:
                continue
            if sample.name == HOST_MEMORY_USED.name:
                memory[uuid] = int(sample.value) // _MIB
            elif sample.name == HOST_UTILIZATION.name:
                util[uuid] = float(sample.value)
    return Usage(memory, util)


def default_fleet(device_config: DeviceConfig | None = None) -> Fleet:
    """The families a cluster is read with: a device config's, else every shipped family with HAMi's chart
    defaults (a family with no node or pod in the cluster shows nothing)."""
    if device_config is not None:
        return Fleet(device_config.families, device_config.resources)
    return Fleet(configured({v.section: v.enable for v in fake_vendors().values()}))


def _row_of(pod: Pod, grants: Sequence[Grant], fleet: Fleet, reasons: dict[str, str]) -> PodRow | None:
    """The pod's line, or None for a pod that has nothing to do with devices (or has finished well)."""
    if pod.status.phase == "Succeeded":
        return None  # its devices are free again, as HAMi counts them
    asks = fleet.asks_devices(pod)
    ours = pod.spec.scheduler_name == DEFAULT_SCHEDULER_NAME
    if not (grants or asks or (ours and not pod.spec.node_name)):
        return None
    unreadable = fleet.unreadable(pod) if asks else ""
    if pod.status.phase == FAILED:
        state, reason = FAILED, pod.status.reason or pod.status.message
    elif unreadable:
        state, reason = UNREADABLE, unreadable
    elif pod.spec.node_name:
        state, reason = pod.metadata.annotations.get(BIND_PHASE, "bound"), ""
    else:
        state, reason = "Pending", reasons.get(pod.metadata.uid, WAITING)
    return PodRow(
        pod=f"{pod.metadata.namespace}/{pod.metadata.name}",
        node=pod.spec.node_name,
        devices=[f"{g.device.uuid}({g.device.usedmem}MiB,{g.device.usedcores}%)" for g in grants],
        state=state,
        reason=reason,
    )


def build_overview(
    cluster: str,
    nodes: Iterable[Node],
    pods: Iterable[Pod],
    events: Iterable[Event],
    usage: Usage | None = None,
    *,
    fleet: Fleet | None = None,
    metrics_url: str = "",
    metrics: str = "",
) -> Overview:
    fleet = fleet or default_fleet()
    reasons = pending_reasons(events)
    holders: dict[str, list[tuple[str, int, int]]] = {}  # device id -> (pod, MiB, cores)
    instances: dict[str, list[MigRow]] = {}
    rows = []
    for pod in sorted(pods, key=lambda p: (p.metadata.namespace, p.metadata.name)):
        grants = fleet.grants(pod)
        row = _row_of(pod, grants, fleet, reasons)
        if row is None:
            continue
        rows.append(row)
        if not pod.spec.node_name or row.state == FAILED:
            continue  # a failed pod's devices are free again
        for grant in grants:
            holders.setdefault(grant.device.uuid, []).append((row.pod, grant.device.usedmem, grant.device.usedcores))
        for m in _mig_allocations(pod):
            instances.setdefault(m.gpu_uuid, []).append(
                MigRow(
                    profile=m.profile,
                    start=m.placement.start,
                    size=m.placement.size,
                    pod=row.pod,
                    mig_uuid=m.mig_uuid or "",
                )
            )
    gpus = []
    for node in sorted(nodes, key=lambda n: n.metadata.name):
        for card in fleet.cards(node):
            held = holders.get(card.id, [])
            gpus.append(
                GpuRow(
                    node=node.metadata.name,
                    vendor=card.vendor,
                    uuid=card.id,
                    type=card.type,
                    memory_mib=card.memory_mib,
                    memory_booked_mib=sum(mem for _, mem, _ in held),
                    memory_used_mib=usage.memory_mib.get(card.id) if usage else None,
                    cores_booked=sum(cores for _, _, cores in held),
                    core_utilization=usage.utilization.get(card.id) if usage else None,
                    slices=card.slices,
                    slices_booked=len(held),
                    pods=sorted(name for name, _, _ in held),
                    mode=card.mode,
                    instances=sorted(instances.get(card.id, []), key=lambda r: (r.start, r.pod)),
                )
            )
    return Overview(cluster=cluster, gpus=gpus, pods=rows, metrics_url=metrics_url, metrics=metrics)


def _mig_allocations(pod: Pod) -> tuple[MigAllocation, ...]:
    try:
        return decode_mig_allocations(pod.metadata.annotations.get(MIG_ALLOCATIONS, "[]"))
    except AnnotationError:
        return ()  # unreadable: the devices annotation still shows what the pod holds


GPU_HEADERS = (
    "NODE",
    "VENDOR",
    "DEVICE",
    "TYPE",
    "MEMORY BOOKED",
    "MEMORY USED",
    "CORES BOOKED",
    "CORES USED",
    "SLICES",
    "PODS",
)
POD_HEADERS = ("POD", "NODE", "DEVICES", "STATE")
MIG_HEADERS = ("NODE", "GPU", "PROFILE", "PLACEMENT", "MIG DEVICE", "POD")


def _gpu_cells(row: GpuRow) -> Sequence[str]:
    return (
        row.node,
        row.vendor,
        short_uuid(row.uuid),
        row.type,
        f"{row.memory_booked_mib}/{row.memory_mib} MiB",
        "-" if row.memory_used_mib is None else f"{row.memory_used_mib} MiB",
        f"{row.cores_booked}%",
        "-" if row.core_utilization is None else f"{row.core_utilization:g}%",
        f"{row.slices_booked}/{row.slices}" + (" MIG" if row.mode == MODE_MIG else ""),
        ",".join(p.split("/", 1)[1] for p in row.pods) or "-",
    )


def _pod_cells(row: PodRow) -> Sequence[str]:
    devices = " ".join(short_uuid(d.split("(", 1)[0]) + "(" + d.split("(", 1)[1] for d in row.devices) or "-"
    state = f"{row.state}: {row.reason}" if row.reason else row.state
    return (row.pod, row.node or "-", devices, state)


def _mig_cells(gpu: GpuRow, row: MigRow) -> Sequence[str]:
    return (
        gpu.node,
        short_uuid(gpu.uuid),
        row.profile,
        f"{row.start}+{row.size}",
        short_uuid(row.mig_uuid) if row.mig_uuid else "(creating)",
        row.pod.split("/", 1)[1],
    )


def render_overview(view: Overview) -> str:
    metrics = f"metrics: {view.metrics_url or '-'}" + (f" ({view.metrics})" if view.metrics != "ok" else "")
    mig = [_mig_cells(gpu, row) for gpu in view.gpus for row in gpu.instances]
    parts = [
        f"cluster: {view.cluster}",
        "",
        render_table(GPU_HEADERS, [_gpu_cells(r) for r in view.gpus]) if view.gpus else "no device nodes registered",
        "",
        *((render_table(MIG_HEADERS, mig), "") if mig else ()),
        render_table(POD_HEADERS, [_pod_cells(r) for r in view.pods]) if view.pods else "no device pods",
        "",
        metrics,
    ]
    return "\n".join(parts)


# --- the command ---------------------------------------------------------------------------------------------


class _Target(msgspec.Struct, frozen=True):
    settings: KubeSettings
    metrics_url: str
    metrics_token_file: str = ""
    device_config: str = ""  # the local stack's device config: its families and resource names


def _target(args: argparse.Namespace) -> _Target:
    """The local stack unless a cluster is named (--kubeconfig, --context, --in-cluster)."""
    if args.kubeconfig or args.context or args.in_cluster:
        # Empty: the service account in a pod, else $KUBECONFIG or ~/.kube/config (as kubectl chooses).
        kubeconfig = "" if args.in_cluster else (args.kubeconfig or "")
        settings = KubeSettings(kubeconfig=kubeconfig, kube_context=args.context or "", kube_timeout=args.timeout)
        return _Target(settings, args.metrics or "", args.metrics_token_file or "")
    _, state = pick_running(args.workdir)
    token_file = args.metrics_token_file or ("" if args.metrics else state.metrics_token_file)
    settings = KubeSettings(kubeconfig=state.kubeconfig, kube_timeout=args.timeout)
    return _Target(settings, args.metrics or state.metrics_url, token_file, state.device_config)


def _fetch(url: str, token_file: str) -> str:
    token = Path(token_file).read_text().strip() if token_file else ""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    with urllib.request.urlopen(request, timeout=_METRICS_TIMEOUT_S) as reply:
        body: bytes = reply.read()
    return body.decode("utf-8", "replace")


async def _usage(url: str, token_file: str = "") -> tuple[Usage | None, str]:
    if not url:
        return None, "not given: --metrics URL adds memory and cores in use"
    try:
        text = await asyncio.to_thread(_fetch, url, token_file)  # the client is blocking: in a thread on purpose
        return parse_usage(text), "ok"
    except (urllib.error.URLError, ValueError, OSError) as err:
        reason = getattr(err, "reason", None) or err or type(err).__name__
        return None, f"not reachable: {reason}"


_ERRNO: Final = re.compile(r"\[Errno -?\d+\] ([^\"')]+)")
_CERTIFICATE: Final = re.compile(r"certificate verify failed: ?([^\"'()]*)", re.I)


def _cause(text: str) -> str:
    if found := _CERTIFICATE.search(text):
        return f"its TLS certificate is not trusted ({found.group(1).strip() or 'verify failed'})"
    if found := _ERRNO.search(text):
        return found.group(1).strip()
    if "timed out" in text.lower() or "timeout" in text.lower():
        return "timed out"
    return text[:200]


def unreachable(server: str, err: HamiError) -> str:
    """One line for an apiserver that does not answer: where, the cause urllib3 buried, and what to check."""
    return (
        f"cannot reach the Kubernetes API at {server}: {_cause(str(err))} "
        "(is the cluster up, and are --kubeconfig/--context the right ones?)"
    )


async def _overview(target: _Target, fleet: Fleet) -> Overview:
    async with KubeClient.from_settings(target.settings) as kube:
        server = str(kube.api_client.configuration.host)
        try:
            nodes, _ = await kube.list_nodes()
            pods, _ = await kube.list_pods()
            events = await kube.list_events(field_selector=f"reason={FAILED_SCHEDULING}")
        except TransientError as err:
            raise TransientError(unreachable(server, err)) from err
    usage, metrics = await _usage(target.metrics_url, target.metrics_token_file)
    return build_overview(
        server, nodes, pods, events, usage, fleet=fleet, metrics_url=target.metrics_url, metrics=metrics
    )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        formatter_class=DefaultsHelp,
        prog="hami status",
        description="Device overview of a cluster: every node's GPUs and other accelerators (every vendor) with "
        "memory and cores booked (from the pods' annotations) and in use (from the metrics service, when it "
        "answers), slices and the pods holding them; then every device pod with its devices and state: why a "
        "pending one waits (its FailedScheduling event), why a failed one failed, and a request that cannot be "
        "read. The running `hami up` by default; any cluster with --kubeconfig/--context/--in-cluster.",
    )
    add_dir_flag(parser)
    parser.add_argument("--kubeconfig", help="a cluster's kubeconfig instead of the local stack")
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current context)")
    parser.add_argument("--in-cluster", action="store_true", help="the service account of the pod this runs in")
    parser.add_argument("--metrics", help="the metrics service's /metrics URL (the local stack's by default)")
    parser.add_argument(
        "--metrics-token-file",
        help="a file holding the bearer token /metrics requires (deploy/'s Secret hami-metrics-token)",
    )
    parser.add_argument(
        "--device-config",
        help="the cluster's HAMi device-config.yaml, for its resource names and vendor sections (default: the "
        "local stack's, or HAMi's chart defaults for every vendor)",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds each API request may take")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table", help="json: for scripts")
    return parser


def status_main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    try:
        target = _target(args)
        path = args.device_config or target.device_config
        fleet = default_fleet(read_device_config(path) if path else None)
        view = run_loop(_overview(target, fleet))
    except HamiError as err:
        print(f"hami status: {err}", file=sys.stderr)
        return 1
    if args.output == "json":
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(view), indent=2).decode() + "\n")
    else:
        print(render_overview(view))
    return 0
