"""``hami up``: the whole system on one machine, in this process, until Ctrl-C (or ``--for`` seconds).

It starts a real ``nats-server`` (or three), the Kubernetes control plane, the webhook (HTTPS), the extender,
the metrics service and N simulated GPU nodes (node agent, allocator, kubelet emulator); submits the example
pods; and prints where they landed, the metrics URL, a trace summary and the cluster's kubeconfig. Service
logs go to ``hami-up.log``. The control plane is the real etcd, kube-apiserver and kube-scheduler when
``make k8s`` has built them, otherwise the Kubernetes API emulator and a scheduler stand-in (it says so)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import httpx
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hami_cli.helpfmt import DefaultsHelp
from hami_cli.manifests import read_pods
from hami_cli.report import (
    PLACEMENT_HEADERS,
    STATUS_HEADERS,
    Fleet,
    pending_reasons,
    placement_rows,
    render_table,
    status_rows,
)
from hami_cli.state import NoStackError, UpState, read_state, remove_state, run_workdir, write_state
from hami_common.annotations import BIND_PHASE, BIND_PHASE_ALLOCATING, TRACE_CONTEXT
from hami_common.errors import HamiError
from hami_common.inventory import NVIDIA_VENDOR
from hami_common.kube import FAILED_SCHEDULING
from hami_common.service import LOG_FORMAT, run_loop
from hami_common.tracing import OTEL_ENDPOINT, OTEL_TRACES_ENDPOINT, setup_tracing
from hami_common.vendors.plugin import fake_vendors
from hami_sim.realk8s import BinariesMissing, find_binaries
from hami_sim.scheduler import is_unschedulable_message
from hami_sim.stack import LocalCluster, StackConfig
from hami_sim.waiting import ConditionTimeoutError, eventually

__all__ = ["StartFailed", "example_paths", "main", "parser", "web_page"]

log = logging.getLogger(__name__)

METRICS_PORT: Final = 31993  # HAMi's monitor port
CTRL_C_POLL_S: Final = 0.2  # how often the Ctrl-C watcher checks whether the stack has stopped
TRACE_FLUSH_S: Final = 1.0  # the longest the stop waits for an OTLP collector
STRAGGLER_S: Final = 10.0  # the longest the stop waits for tasks left once every service has stopped
EXIT_STUCK: Final = 70  # EX_SOFTWARE: stopped, but a task ignored its cancellation
HAMI: Final = "`./hami"  # how the README runs it from the checkout
SETTLE_S: Final = 30.0  # how long the demo waits for its examples to land before printing
VENDOR_EXAMPLES: Final = "vendors"  # <examples>/vendors/<vendor>.yaml: submitted only with --vendors naming it
EMULATED: Final = "emulated"
REAL: Final = "real"
EXIT_NO_K8S: Final = 69  # EX_UNAVAILABLE: --kube real, but the real peers are not built


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hami up", description=__doc__, formatter_class=DefaultsHelp)
    parser.add_argument(
        "--workdir",
        "--dir",
        dest="workdir",
        type=Path,
        help="kubeconfig, certificates, logs (default: a folder of this run's own, $TMPDIR/hami-up-<uid>/<pid>)",
    )
    parser.add_argument("--nodes", type=int, default=4, help="simulated GPU nodes")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument(
        "--mig-nodes", type=int, default=1, help="nodes beside --nodes whose GPUs are cut into MIG instances"
    )
    parser.add_argument("--mig-gpus", type=int, default=2, help="GPUs (A100-80GB, MIG mode on) per MIG node")
    parser.add_argument(
        "--vendors",
        type=_vendors,
        default=NVIDIA_VENDOR,
        help="device vendors, comma separated: nvidia and any of "
        f"{', '.join(sorted(fake_vendors()))}; each one beside nvidia adds a node of its fake devices, enables it "
        "in the device config and submits its examples (<examples>/vendors/<vendor>.yaml)",
    )
    parser.add_argument("--vendor-devices", type=int, default=2, help="devices per vendor node")
    parser.add_argument("--examples", type=Path, default=Path("examples"), help="pod YAML files to submit at start")
    parser.add_argument("--no-examples", action="store_true", help="submit nothing")
    parser.add_argument("--metrics-port", type=int, default=METRICS_PORT, help="0: any free port")
    parser.add_argument(
        "--kube",
        choices=(EMULATED, REAL),
        help="real: etcd, kube-apiserver and kube-scheduler built by `make k8s`; emulated: the API emulator and a "
        "scheduler stand-in (default: real when the binaries are built, else emulated, saying so)",
    )
    parser.add_argument(
        "--scheduler-replicas", type=int, default=1, help="real: kube-scheduler + extender pairs (one leads)"
    )
    parser.add_argument(
        "--nats-servers",
        type=int,
        default=1,
        help="1: one nats-server; 3: a JetStream cluster on loopback with the placement stream on every server",
    )
    parser.add_argument("--for", dest="duration", type=float, help="stop by itself after this many seconds")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the work directory (logs, kubeconfig, certificates) after a clean stop; a failed start keeps "
        "it always, for its log",
    )
    return parser


def _vendors(text: str) -> tuple[str, ...]:
    words = tuple(dict.fromkeys(w.strip().lower() for w in text.split(",") if w.strip()))
    known = {NVIDIA_VENDOR, *fake_vendors()}
    unknown = [w for w in words if w not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown vendor {unknown[0]!r}; choose from {', '.join(sorted(known))}")
    return words


def example_paths(folder: Path, vendors: Sequence[str]) -> list[Path]:
    """The default examples (NVIDIA's, the folder's own files) and, for each other vendor on, its file in
    ``<folder>/vendors/``; a vendor's pods are never submitted without its node."""
    paths = [folder] if folder.exists() else []
    for vendor in vendors:
        if vendor == NVIDIA_VENDOR:
            continue
        path = folder / VENDOR_EXAMPLES / f"{vendor}.yaml"
        if path.exists():
            paths.append(path)
    return paths


def _log_to(path: Path) -> None:
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


async def _submit_examples(cluster: LocalCluster, folder: Path, vendors: Sequence[str] = ()) -> list[str]:
    pods = await asyncio.to_thread(read_pods, example_paths(folder, vendors))
    uids = []
    for pod in pods:
        name = pod.get("metadata", {}).get("name", "?")
        try:
            created = await cluster.submit(pod)
        except HamiError as err:
            print(f"  pod/{name}: {err}")
            continue
        uids.append(created["metadata"]["uid"])
        print(f"  pod/{name} created")
    return uids


async def _reasons(cluster: LocalCluster, uids: list[str]) -> dict[str, str]:
    """uid -> why it is still pending: the scheduler stand-in's verdict, or on the real control plane the
    latest FailedScheduling Event that kube-scheduler recorded."""
    if cluster.real is not None:
        events = await cluster.kube.list_events(field_selector=f"reason={FAILED_SCHEDULING}")
        return {uid: why for uid, why in pending_reasons(events).items() if uid in uids}
    found = {}
    for uid in uids:
        verdict = cluster.verdict(uid)
        if verdict is not None and (verdict.reasons or verdict.error):
            found[uid] = verdict.error or "; ".join(f"{n}: {r}" for n, r in sorted(verdict.reasons.items())[:2])
    return found


async def _settled(cluster: LocalCluster, uids: list[str]) -> bool:
    """Every example is either pending with a reason, or admitted by its kubelet with its grant settled: the
    device plugin writes bind-phase success after its Allocate answer, so the kubelet's admission alone would
    print a placement still "allocating"."""
    pods, _ = await cluster.kube.list_pods()
    resource = cluster.config.gpu_resource
    allocating = {
        p.metadata.uid
        for p in pods
        # NVIDIA's plugin settles bind-phase; a family whose plugin never does (Cambricon) is not waited for
        if p.metadata.annotations.get(BIND_PHASE) == BIND_PHASE_ALLOCATING
        and any(resource in c.resources.limits for c in (*p.spec.init_containers, *p.spec.containers))
    }
    pending = [uid for uid in uids if uid not in cluster.admitted or uid in allocating]
    reasons = await _reasons(cluster, pending)
    # on the real control plane a bind error (a node lock held a moment) is a FailedScheduling Event too, but
    # kube-scheduler retries that pod after its backoff: only "no node fits" is where an example stays
    final = {uid for uid, why in reasons.items() if cluster.real is None or is_unschedulable_message(why)}
    return not pending or set(pending) <= final


def _trace_summary(spans: Sequence[ReadableSpan], traceparent: str) -> str:
    trace_id = int(traceparent.split("-")[1], 16)
    mine = sorted((s for s in spans if s.context.trace_id == trace_id), key=lambda s: s.start_time or 0)
    steps = [f"{s.name} {((s.end_time or 0) - (s.start_time or 0)) / 1e6:.1f}ms" for s in mine]
    traces = len({s.context.trace_id for s in spans})
    return f"{traces} traces, {len(spans)} spans; trace {trace_id:032x}:\n    " + " → ".join(steps)


async def _show(cluster: LocalCluster, uids: list[str], exporter: InMemorySpanExporter) -> None:
    with contextlib.suppress(ConditionTimeoutError):
        await eventually(lambda: _settled(cluster, uids), timeout=SETTLE_S, what="examples placed")
    pods, _ = await cluster.kube.list_pods()
    nodes, _ = await cluster.kube.list_nodes()
    device_config = cluster.config.device_config()
    fleet = Fleet(device_config.families, device_config.resources)  # every vendor the stack runs
    print("\nPlacements:")
    print(render_table(PLACEMENT_HEADERS, placement_rows(pods, await _reasons(cluster, uids), fleet)))
    print("\nDevices:")
    print(render_table(STATUS_HEADERS, [r for r in status_rows(nodes, pods, fleet) if r[-1] != "-"] or []))
    async with httpx.AsyncClient(timeout=5.0) as client:
        try:
            headers = {"Authorization": f"Bearer {cluster.metrics_token}"} if cluster.metrics_token else {}
            text = (await client.get(cluster.metrics_url, headers=headers)).text
            series = sum(1 for line in text.splitlines() if line.startswith("hami_"))
            print(f"\nMetrics:     {cluster.metrics_url}   ({series} hami_* series)   web page: {web_page(cluster)}")
        except httpx.HTTPError as err:
            print(f"\nMetrics:     {cluster.metrics_url}   (not answering: {err})")
    traced = next(
        (p for p in pods if p.metadata.uid in cluster.admitted and TRACE_CONTEXT in p.metadata.annotations), None
    )
    if traced is not None:
        print(
            "Traces:      " + _trace_summary(exporter.get_finished_spans(), traced.metadata.annotations[TRACE_CONTEXT])
        )


def web_page(cluster: LocalCluster) -> str:
    """The metrics service's web page (docs/webui.md), beside its /metrics."""
    return cluster.metrics_url.removesuffix("/metrics") + "/ui/"


def _hold_ctrl_c() -> None:
    """Block SIGINT before any thread or child starts. The terminal sends Ctrl-C to the whole process group;
    children inherit the blocked mask (nats-server, the API emulator, kube-apiserver keep serving instead of
    dying under the services with a traceback and a burst of reconnect warnings), and ``_watch_ctrl_c``
    takes it for this process alone, which then stops everything in order."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _watch_ctrl_c(loop: asyncio.AbstractEventLoop, stop: asyncio.Event, done: threading.Event) -> None:
    while not done.is_set():
        if signal.sigtimedwait({signal.SIGINT}, CTRL_C_POLL_S) is not None:
            if stop.is_set():
                print("  (already stopping)", flush=True)
            loop.call_soon_threadsafe(stop.set)


async def _up(args: argparse.Namespace, exporter: InMemorySpanExporter) -> None:
    workdir: Path = args.workdir
    sockdir = Path(tempfile.mkdtemp(prefix="hami-", dir="/tmp"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    watching = threading.Event()
    watcher = threading.Thread(target=_watch_ctrl_c, args=(loop, stop, watching), name="ctrl-c", daemon=True)
    watcher.start()
    config = StackConfig(
        workdir=workdir,
        sockdir=sockdir,
        nodes=args.nodes,
        gpus_per_node=args.gpus,
        mig_nodes=args.mig_nodes,
        mig_gpus_per_node=args.mig_gpus,
        taint_mig_nodes=True,  # only pods that tolerate it land there: each example where its comment says
        vendors=args.vendors,
        vendor_devices_per_node=args.vendor_devices,
        kube=args.kube,
        scheduler_replicas=args.scheduler_replicas,
        nats_servers=args.nats_servers,
    )
    try:
        cluster = LocalCluster(StackConfig(**{**_fields(config), "metrics_port": args.metrics_port}))
    except OSError:
        print(f"port {args.metrics_port} is taken; metrics on a free port instead")
        cluster = LocalCluster(config)
    started = time.monotonic()
    try:
        try:
            await cluster.start(progress=lambda line: print(f"  {line} ...", flush=True))
        except Exception as err:
            log.exception("the stack did not start")  # the whole story, peers' output included, in the log
            raise StartFailed(_first_line(err)) from err
        state = UpState(
            api_url=cluster.api.url,
            kubeconfig=str(config.kubeconfig),
            webhook_url=cluster.webhook_url,
            ca_file=str(cluster.tls.ca) if cluster.tls else "",
            metrics_url=cluster.metrics_url,
            metrics_token_file=_metrics_token_file(cluster, workdir),
            nats_url=cluster.nats.url,
            pid=os.getpid(),
            device_config=config.service_device_config(),
            **_real_access(cluster),
        )
        write_state(workdir, state)
        print(f"started in {time.monotonic() - started:.1f}s")
        print(f"NATS:        {cluster.nats.url}")
        print(f"Kubernetes:  {cluster.api.url}")
        print(f"kubeconfig:  {config.kubeconfig}   (kubectl --kubeconfig {config.kubeconfig} get pods -o wide)")
        print(f"webhook:     {cluster.webhook_url}/webhook   extender: {cluster.extender_url}")
        print(f"metrics:     {cluster.metrics_url}   web page: {web_page(cluster)}")
        print(f"logs:        {workdir / 'hami-up.log'}", flush=True)
        if not args.no_examples:
            print(f"submitting the examples in {args.examples}:")
            uids = await _submit_examples(cluster, args.examples, args.vendors)
            await _show(cluster, uids, exporter)
        print(
            f"\n{HAMI} submit -f pod.yaml` adds pods, {HAMI} status` shows the GPUs (or `hami ...` with .venv/bin on "
            "your PATH). Ctrl-C stops everything.",
            flush=True,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=args.duration)
        print(f"stopping: the scheduler, NATS, {args.nodes} nodes, the services, the Kubernetes API ...", flush=True)
    finally:
        remove_state(workdir)  # from now on `hami status` says no stack runs here, not "connection refused"
        await cluster.close()
        shutil.rmtree(sockdir, ignore_errors=True)
        watching.set()
        stuck = await end_stragglers(STRAGGLER_S)
        if stuck:
            # asyncio.run would wait for them for ever: say which, and leave (everything else has stopped)
            print(f"hami up: {len(stuck)} task(s) did not stop when cancelled: {', '.join(stuck)}", flush=True)
            log.error("tasks that did not stop when cancelled: %s", ", ".join(stuck))
            logging.shutdown()
            os._exit(EXIT_STUCK)


class StartFailed(HamiError):
    """The stack did not come up; the message is the first line of why, the log holds the rest."""


def _first_line(err: BaseException, limit: int = 300) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def end_stragglers(grace_s: float) -> list[str]:
    """Cancel every task left but this one and wait up to ``grace_s``; the names of those still running
    (each with where it waits), which a task that swallows its cancellation would be."""
    current = asyncio.current_task()
    rest = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in rest:
        task.cancel()
    if not rest:
        return []
    _, pending = await asyncio.wait(rest, timeout=grace_s)
    return sorted(f"{t.get_name()} ({_where(t)})" for t in pending)


def _where(task: asyncio.Task[Any]) -> str:
    frames = task.get_stack(limit=1)
    return f"{frames[0].f_code.co_filename}:{frames[0].f_lineno}" if frames else "?"


def _metrics_token_file(cluster: LocalCluster, workdir: Path) -> str:
    """Where deploy/'s metrics service runs, /metrics wants its bearer token: kept for `hami status`."""
    if not cluster.metrics_token:
        return ""
    path = workdir / "metrics-token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(cluster.metrics_token)
    return str(path)


def _real_access(cluster: LocalCluster) -> dict[str, Any]:
    if cluster.real is None:
        return {}
    plane = cluster.real.plane
    return {
        "kube": "real",
        "api_ca": str(plane.ca.cert_file),
        "client_cert": str(plane.admin.cert),
        "client_key": str(plane.admin.key),
    }


def _fields(config: StackConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in StackConfig.__dataclass_fields__}


def _shutdown_tracing(provider: TracerProvider) -> None:
    """Send the spans still queued, but never let an unreachable collector hold the stop for long."""
    endpoint = os.environ.get(OTEL_TRACES_ENDPOINT) or os.environ.get(OTEL_ENDPOINT)
    if endpoint:
        print(f"sending the last spans to {endpoint} (at most {TRACE_FLUSH_S:g} s) ...", flush=True)
    # In a daemon thread: the OTLP exporter retries with backoff for up to its 10 s timeout per batch.
    flusher = threading.Thread(target=provider.shutdown, name="otel-shutdown", daemon=True)
    flusher.start()
    flusher.join(TRACE_FLUSH_S)
    if flusher.is_alive():
        print(f"  {endpoint} did not take them in time; the rest are dropped", flush=True)


def _choose_kube(asked: str | None) -> str | None:
    """Which control plane runs: the real one whenever its binaries are built, unless ``--kube`` says; None
    (after one line saying why) when ``--kube real`` is asked for without them."""
    try:
        find_binaries()
    except BinariesMissing as err:
        if asked == REAL:
            print(f"hami up: --kube real needs the real Kubernetes peers: {err}", flush=True)
            return None
        if asked is None:
            print(f"hami up: on the Kubernetes API emulator, as the real peers are missing: {err}", flush=True)
        return EMULATED
    return asked or REAL


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    kube = _choose_kube(args.kube)
    if kube is None:
        return EXIT_NO_K8S
    args.kube = kube
    if args.workdir is None:
        args.workdir = run_workdir()
    else:
        try:
            other = read_state(args.workdir)
        except NoStackError:
            pass
        else:
            print(f"hami up: another `hami up` (pid {other.pid}) runs in {args.workdir}; choose another --workdir")
            return 1
    ours = not args.workdir.exists()  # a folder this run makes is this run's to remove when it stops
    args.workdir.mkdir(parents=True, exist_ok=True)
    _hold_ctrl_c()
    _log_to(args.workdir / "hami-up.log")
    exporter = InMemorySpanExporter()
    provider = setup_tracing("hami-up", extra_processor=SimpleSpanProcessor(exporter))
    print(
        f"hami up: {args.nodes} nodes × {args.gpus} GPUs, {kube} Kubernetes (work directory {args.workdir})", flush=True
    )
    log_file = args.workdir / "hami-up.log"
    try:
        run_loop(_up(args, exporter))
    except StartFailed as err:
        print(f"hami up: could not start: {err}\n  the services' log: {log_file}", flush=True)
        return 1
    except HamiError as err:
        print(f"hami up: stopped on an error: {err}\n  the services' log: {log_file}", flush=True)
        return 1
    finally:
        if provider is not None:
            _shutdown_tracing(provider)
    if ours and not args.keep:
        logging.shutdown()  # the log file is in the folder
        shutil.rmtree(args.workdir, ignore_errors=True)
        print(f"removed its work directory {args.workdir} (--keep keeps it)", flush=True)
    print("stopped.", flush=True)
    return 0
