"""``hami submit -f pod.yaml`` and ``hami status`` against a running ``hami up``."""

from __future__ import annotations

import argparse
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path

from hami_cli.manifests import read_pods
from hami_cli.state import default_workdir, read_state
from hami_common.errors import HamiError
from hami_common.kube import KubeClient, KubeSettings
from hami_common.service import run_loop
from hami_sim.stack import Admitter
from hami_sim.stack.report import FAILED_SCHEDULING, pending_reasons, placement_rows, render_table, status_rows

__all__ = ["status_main", "submit_main"]

STATUS_HEADERS = ("NODE", "GPU", "TYPE", "MEMORY", "CORES", "SLICES", "PODS")
PLACEMENT_HEADERS = ("POD", "NODE", "DEVICES", "STATE")


def _workdir_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=default_workdir(), help="the running `hami up`'s folder")


async def _submit(workdir: Path, files: list[Path]) -> int:
    state = read_state(workdir)
    if state.kube == "real":  # kube-apiserver calls the webhook itself; we only create, as kubectl would
        tls = ssl.create_default_context(cafile=state.api_ca)
        tls.load_cert_chain(state.client_cert, state.client_key)
        admitter = Admitter(state.webhook_url, state.ca_file, state.api_url, api_tls=tls, review=False)
    else:
        admitter = Admitter(state.webhook_url, state.ca_file, state.api_url)
    status = 0
    try:
        for pod in read_pods(files):
            name = pod.get("metadata", {}).get("name", "?")
            try:
                await admitter.create(pod)
                print(f"pod/{name} created")
            except HamiError as err:
                print(f"pod/{name}: {err}", file=sys.stderr)
                status = 1
    finally:
        await admitter.close()
    return status


async def _status(workdir: Path) -> int:
    state = read_state(workdir)
    async with KubeClient.from_settings(KubeSettings(kubeconfig=state.kubeconfig)) as kube:
        nodes, _ = await kube.list_nodes()
        pods, _ = await kube.list_pods()
        events = await kube.list_events(field_selector=f"reason={FAILED_SCHEDULING}")
    print(render_table(STATUS_HEADERS, status_rows(nodes, pods)))
    print()
    print(render_table(PLACEMENT_HEADERS, placement_rows(pods, pending_reasons(events))))
    print(f"\nmetrics: {state.metrics_url}\nkubeconfig: {state.kubeconfig}")
    return 0


def submit_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="hami submit", description="admit and create pods in `hami up`'s cluster")
    parser.add_argument("-f", "--filename", type=Path, action="append", required=True, help="YAML file or folder")
    _workdir_flag(parser)
    args = parser.parse_args(argv)
    try:
        return run_loop(_submit(args.workdir, args.filename))
    except FileNotFoundError:
        print(f"hami submit: no running `hami up` in {args.workdir}", file=sys.stderr)
        return 1
    except HamiError as err:
        print(f"hami submit: {err}", file=sys.stderr)
        return 1


def status_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="hami status", description="nodes, GPUs, slices and the pods using them")
    _workdir_flag(parser)
    args = parser.parse_args(argv)
    try:
        return run_loop(_status(args.workdir))
    except FileNotFoundError:
        print(f"hami status: no running `hami up` in {args.workdir}", file=sys.stderr)
        return 1
    except HamiError as err:
        print(f"hami status: {err}", file=sys.stderr)
        return 1
