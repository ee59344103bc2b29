"""Memory of the extender's probe port under a flood of connections that never send a whole request.

Issue 28 item 4: the probe port listens on the pod's address, where any neighbour can open connections. The
port is served alone in a child process on uvloop, as the service runs it, once as it is now (under
:mod:`hami_common.connections`' guard, default settings: at most 64 connections, 5 s for a whole request)
and once as it was at ``--baseline`` (a plain asyncio server, one task per connection, a 5 s deadline and
no cap). The flood holds ``--connections`` connections open from this process, a third silent, a third
stopped in a request's headers, a third a truncated TLS ClientHello; meanwhile the child's RSS is sampled,
and a kubelet's GET /healthz is timed once the flood is open.

    python benchmarks/half_open_flood.py [--quick] [--connections 10000] [--baseline 97b2a68]

The last line is JSON: per variant, the child's RSS before the flood, its peak and after (MiB), the
connections the server held once the flood was open, the seconds until it held none, and the kubelet's
answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]
WAVE: Final = 500
HALF_SENT: Final = b"GET /healthz HTTP/1.1\r\nHost: 10.0.0.7:8081\r\nUser-Agent: kube-probe/1.31\r\nAcc"
TRUNCATED_HELLO: Final = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40
SAMPLE_S: Final = 0.05
DROP_GIVE_UP_S: Final = 120.0


# --- the child: one probe port, served as the extender serves it ---------------------------------------------


async def _serve_guarded(port: int) -> None:
    from hami_extender.main import _probe_server
    from hami_extender.settings import ExtenderSettings

    server = _probe_server(ExtenderSettings(health_port=port, health_host="127.0.0.1"))
    await server.serve()


async def _serve_baseline(port: int, source: Path) -> None:
    spec = importlib.util.spec_from_file_location("baseline_main", source)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    server = await asyncio.start_server(module._answer_probe, host="127.0.0.1", port=port)
    async with server:
        await server.serve_forever()


def serve(variant: str, port: int, source: str) -> None:
    from hami_common.service import run_loop

    body = _serve_guarded(port) if variant == "guarded" else _serve_baseline(port, Path(source))
    run_loop(body)


# --- the parent: flood and measure ---------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def sockets_held(pid: int) -> int:
    """The child's open sockets: its listener and every connection it holds."""
    held = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            held += Path(fd).readlink().name.startswith("socket:")
    return held


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def kubelet_get(port: int) -> tuple[str, float]:
    """One probe as the kubelet sends it: the status line, and the seconds to the answer's end."""
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
    except (OSError, TimeoutError) as err:
        return f"failed: {err!r}", time.perf_counter() - started
    return answer.split(b"\r\n", 1)[0].decode(errors="replace"), time.perf_counter() - started


@dataclasses.dataclass
class Result:
    variant: str
    rss_before_mib: float
    rss_peak_mib: float
    rss_after_mib: float
    opened: int
    held_by_server: int  # connections the server held when the flood was open
    kubelet: str
    kubelet_s: float
    all_dropped_s: float


async def flood(variant: str, pid: int, port: int, connections: int) -> Result:
    before = rss_mib(pid)
    idle_sockets = sockets_held(pid)
    peak = before
    stop_sampling = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop_sampling.is_set():
            peak = max(peak, rss_mib(pid))
            await asyncio.sleep(SAMPLE_S)

    held: list[asyncio.StreamWriter] = []
    watching: list[asyncio.Task[None]] = []

    async def until_dropped(reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass

    async def one(i: int) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return
        held.append(writer)
        sent = (b"", HALF_SENT, TRUNCATED_HELLO)[i % 3]
        if sent:
            writer.write(sent)
            with contextlib.suppress(OSError):
                await writer.drain()
        watching.append(asyncio.create_task(until_dropped(reader)))

    sampler = asyncio.create_task(sample())
    started = time.perf_counter()
    for start in range(0, connections, WAVE):
        await asyncio.gather(*(one(i) for i in range(start, min(connections, start + WAVE))))
    await asyncio.sleep(0.5)  # let the server take in what was sent
    held_by_server = sockets_held(pid) - idle_sockets
    kubelet, kubelet_s = await kubelet_get(port)
    # the server's view, not the flood's: a connection the kernel's full accept queue dropped looks open here
    for _ in range(int(DROP_GIVE_UP_S / SAMPLE_S)):
        if sockets_held(pid) <= idle_sockets:
            break
        await asyncio.sleep(SAMPLE_S)
    all_dropped_s = time.perf_counter() - started
    stop_sampling.set()
    await sampler
    for writer in held:
        writer.close()
    for task in watching:
        task.cancel()
    return Result(
        variant=variant,
        rss_before_mib=round(before, 1),
        rss_peak_mib=round(peak, 1),
        rss_after_mib=round(rss_mib(pid), 1),
        opened=len(watching),
        held_by_server=held_by_server,
        kubelet=kubelet,
        kubelet_s=round(kubelet_s, 4),
        all_dropped_s=round(all_dropped_s, 2),
    )


def run_variant(variant: str, connections: int, source: Path | None) -> Result:
    port = free_port()
    command = [sys.executable, __file__, "--serve", variant, "--port", str(port), "--source", str(source or "")]
    child = subprocess.Popen(command, cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {variant} probe port did not start")
            time.sleep(0.1)
        time.sleep(0.5)  # settle after start-up
        return asyncio.run(flood(variant, child.pid, port, connections))
    finally:
        child.terminate()
        child.wait(timeout=30)


def baseline_source(revision: str, scratch: Path) -> Path:
    source = subprocess.run(
        ["git", "show", f"{revision}:services/extender/hami_extender/main.py"],
        cwd=REPO,
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    path = scratch / "baseline_main.py"
    path.write_text(source)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--baseline", default="97b2a68", help="revision whose probe port is compared ('': none)")
    parser.add_argument("--quick", action="store_true", help="1,000 connections, no baseline (a smoke run)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # the child
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--source", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.connections, args.baseline = 1_000, ""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.connections + 1024  # per process: the flood holds one end of each, the server the other
    if hard != resource.RLIM_INFINITY and hard < wanted:
        sys.exit(f"the hard open-file limit {hard} is below {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))  # the child inherits it
    if args.serve:
        serve(args.serve, args.port, args.source)
        return
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        variants: list[tuple[str, Path | None]] = [("guarded", None)]
        if args.baseline:
            variants.append((f"baseline {args.baseline}", baseline_source(args.baseline, Path(scratch))))
        for variant, source in variants:
            result = run_variant("guarded" if source is None else "baseline", args.connections, source)
            result.variant = variant
            results.append(result)
    header = f"{'variant':<20} {'RSS before':>10} {'peak':>8} {'after':>8} {'opened':>7} {'held':>6}"
    print(f"{header} {'all dropped':>11} {'kubelet':>10}")
    for r in results:
        print(
            f"{r.variant:<20} {r.rss_before_mib:>8.1f}Mi {r.rss_peak_mib:>6.1f}Mi {r.rss_after_mib:>6.1f}Mi "
            f"{r.opened:>7} {r.held_by_server:>6} {r.all_dropped_s:>10.1f}s {r.kubelet_s * 1000:>8.1f}ms  {r.kubelet}"
        )
    print(json.dumps({"connections": args.connections, "results": [dataclasses.asdict(r) for r in results]}))


if __name__ == "__main__":
    main()
