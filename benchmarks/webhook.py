"""Admission throughput and latency of ``hami-webhook`` over HTTPS.

Starts the webhook as its own process (TLS with a throw-away self-signed certificate, no apiserver, no
NATS) and drives it from this process with ``--concurrency`` keep-alive HTTPS connections, each sending
real-shaped AdmissionReviews of a GPU pod that the rules mutate, one after another as the apiserver
does. The client is a minimal HTTP/1.1 one on asyncio streams: a general client (httpx) costs more CPU
per request than the webhook itself, and on a two-core machine it would measure itself. Prints the figures, then one
JSON line: ``{"admissions_per_s": …, "p50_ms": …, "p99_ms": …, …}``.

    python benchmarks/webhook.py [--quick] [--requests N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hami_sim.tls import write_serving_certificate

TARGET_RATE = 1000.0
TARGET_P99_MS = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def admission_review(i: int) -> bytes:
    """A CREATE of a pod with one GPU container and a sidecar, as the apiserver sends it."""
    ctr: dict[str, Any] = {
        "name": "cuda",
        "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "cpu": "2"}},
        "env": [{"name": "MODEL", "value": "llama"}],
        "terminationMessagePath": "/dev/termination-log",
        "imagePullPolicy": "IfNotPresent",
    }
    sidecar: dict[str, Any] = {"name": "log", "image": "busybox", "resources": {"limits": {"cpu": "100m"}}}
    pod = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": f"train-{i}", "namespace": "team-a", "labels": {"app": "train"}},
        "spec": {
            "containers": [ctr, sidecar],
            "schedulerName": "default-scheduler",
            "restartPolicy": "Always",
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "securityContext": {},
        },
        "status": {},
    }
    review = {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": f"uid-{i}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:team-a:default", "groups": ["system:authenticated"]},
            "object": pod,
            "dryRun": False,
        },
    }
    return json.dumps(review).encode()


async def wait_ready(host: str, port: int, context: ssl.SSLContext, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the webhook exited with {server.returncode}")
        try:
            _, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=host)
        except OSError:
            await asyncio.sleep(0.05)  # polling a process that is starting: nothing to await
            continue
        writer.close()
        return
    raise SystemExit("the webhook did not start in 30 s")


def http_request(body: bytes) -> bytes:
    head = (
        "POST /webhook?timeout=10s HTTP/1.1\r\nHost: hami-webhook.hami-system.svc\r\n"
        f"Content-Type: application/json\r\nAccept: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def connection(
    host: str, port: int, context: ssl.SSLContext, requests: list[bytes], count: int, latencies: list[float] | None
) -> None:
    """One keep-alive HTTPS connection sending ``count`` admissions one after another, as the apiserver does."""
    reader, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=host)
    try:
        for i in range(count):
            start = time.perf_counter()
            writer.write(requests[i % len(requests)])
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            elapsed = time.perf_counter() - start
            if not head.startswith(b"HTTP/1.1 200") or b'"allowed":true' not in body:
                raise SystemExit(f"unexpected answer: {head[:40]!r} {body[:200]!r}")
            if latencies is not None:
                latencies.append(elapsed)
    finally:
        writer.close()


async def drive(
    port: int, cafile: Path, requests: int, concurrency: int, warmup: int, server: subprocess.Popen[bytes]
) -> tuple[list[float], float]:
    host = "127.0.0.1"
    context = ssl.create_default_context(cafile=str(cafile))
    await wait_ready(host, port, context, server)
    payloads = [http_request(admission_review(i)) for i in range(256)]
    latencies: list[float] = []
    await asyncio.gather(
        *(connection(host, port, context, payloads, warmup // concurrency, None) for _ in range(concurrency))
    )
    began = time.perf_counter()
    await asyncio.gather(
        *(connection(host, port, context, payloads, requests // concurrency, latencies) for _ in range(concurrency))
    )
    return latencies, time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short run (a few seconds)")
    parser.add_argument("--requests", type=int, default=0, help="admissions to measure")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent keep-alive connections")
    args = parser.parse_args()
    requests = args.requests or (800 if args.quick else 10000)
    warmup = 200 if args.quick else 1000
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        files = write_serving_certificate(Path(folder))
        cert, key = files.cert, files.key
        env = dict(os.environ, OTEL_SDK_DISABLED=os.environ.get("OTEL_SDK_DISABLED", "false"))
        command = [
            sys.executable,
            "-m",
            "hami_webhook.main",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--no-watch-cluster",
            "--no-publish-events",
        ]
        server = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
        try:
            latencies, wall = asyncio.run(drive(port, files.ca, requests, args.concurrency, warmup, server))
        finally:
            server.terminate()
            server.wait(timeout=10)
    latencies.sort()
    rate = len(latencies) / wall
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    print(f"admissions: {len(latencies)} over {args.concurrency} HTTPS keep-alive connections in {wall:.2f} s")
    print(f"throughput: {rate:.0f} admissions/s (target >= {TARGET_RATE:.0f})")
    worst = latencies[-1] * 1000
    print(f"latency:    p50 {p50:.2f} ms, p99 {p99:.2f} ms (target p99 <= {TARGET_P99_MS:.0f} ms), max {worst:.2f} ms")
    summary = {
        "benchmark": "webhook",
        "admissions_per_s": round(rate, 1),
        "p50_ms": round(p50, 3),
        "p99_ms": round(p99, 3),
        "requests": len(latencies),
        "concurrency": args.concurrency,
        "meets_target": rate >= TARGET_RATE and p99 <= TARGET_P99_MS,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
