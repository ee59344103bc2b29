"""``hami submit -f FILE``: the objects of YAML files created in a running ``hami up``."""

from __future__ import annotations

import argparse
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import httpx
import msgspec

from hami_cli.helpfmt import DefaultsHelp
from hami_cli.manifests import read_documents
from hami_cli.state import UpState, add_dir_flag, pick_running
from hami_common.errors import HamiError, InvalidInput
from hami_common.service import run_loop
from hami_sim.admission import Admitter
from hami_sim.kubeapi import RESOURCES, ResourceType

__all__ = ["parser", "submit_main"]

# Created by the stack, or only a verb on a pod: a manifest of these would fight the stack, not configure it.
_STACK_OWNED: Final = frozenset({"Binding", "Event", "MutatingWebhookConfiguration"})
_METRICS_TIMEOUT_S: Final = 3.0
Json = dict[str, Any]


def _api_tls(state: UpState) -> ssl.SSLContext | None:
    if state.kube != "real":
        return None
    tls = ssl.create_default_context(cafile=state.api_ca)
    tls.load_cert_chain(state.client_cert, state.client_key)
    return tls


def _kinds() -> dict[tuple[str, str], ResourceType]:
    return {(rt.api_version, rt.kind): rt for rt in RESOURCES}


def _label(doc: Json) -> str:
    return f"{str(doc.get('kind') or '?').lower()}/{(doc.get('metadata') or {}).get('name') or '?'}"


def _order(doc: Json) -> int:
    """Namespaces first and pods last, so a file's quota is in place before its pods are admitted."""
    return {"Namespace": 0, "Pod": 2}.get(str(doc.get("kind")), 1)


async def _create(api: httpx.AsyncClient, rt: ResourceType, doc: Json) -> str:
    namespace = str((doc.get("metadata") or {}).get("namespace") or "default")
    base = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
    path = f"{base}/namespaces/{namespace}/{rt.plural}" if rt.namespaced else f"{base}/{rt.plural}"
    try:
        reply = await api.post(path, content=msgspec.json.encode(doc), headers={"Content-Type": "application/json"})
    except httpx.HTTPError as err:
        raise HamiError(f"apiserver unreachable: {err}") from err
    if reply.status_code == httpx.codes.CONFLICT:
        return "unchanged (already exists)"
    if reply.status_code >= httpx.codes.BAD_REQUEST:
        try:
            message = str(msgspec.json.decode(reply.content).get("message") or reply.text)
        except (msgspec.DecodeError, AttributeError):
            message = reply.text
        raise InvalidInput(f"refused by the apiserver (HTTP {reply.status_code}): {message[:300]}")
    return "created"


async def _exists(api: httpx.AsyncClient, pod: Json) -> bool:
    meta = pod.get("metadata") or {}
    if not meta.get("name"):
        return False  # generateName: always a new pod
    path = f"/api/v1/namespaces/{meta.get('namespace') or 'default'}/pods/{meta['name']}"
    try:
        return (await api.get(path)).status_code == httpx.codes.OK
    except httpx.HTTPError as err:
        raise HamiError(f"apiserver unreachable: {err}") from err


async def _submit(workdir: Path | None, files: list[Path]) -> int:
    where, state = pick_running(workdir)
    docs = sorted(read_documents(files), key=_order)
    if not docs:
        print("hami submit: the files hold no manifests", file=sys.stderr)
        return 1
    kinds = _kinds()
    tls = _api_tls(state)
    admitter = Admitter(state.api_url, api_tls=tls)  # either apiserver calls the webhook itself
    status = 0
    try:
        async with httpx.AsyncClient(base_url=state.api_url, verify=tls or True, timeout=10.0) as api:
            for doc in docs:
                label = _label(doc)
                kind, version = str(doc.get("kind") or ""), str(doc.get("apiVersion") or "")
                rt = kinds.get((version, kind))
                try:
                    if kind == "Pod" and version == "v1" and await _exists(api, doc):
                        # as for every other kind: submitting the examples again (README) is no error
                        outcome = "unchanged (already exists)"
                    elif kind == "Pod" and version == "v1":  # the apiserver calls the webhook
                        await admitter.create(doc)
                        outcome = "created"
                    elif rt is None or kind in _STACK_OWNED:
                        why = "the stack manages it" if rt is not None else "not served by this stack's apiserver"
                        print(f"{label} skipped: {version or '?'} {kind or '?'} is {why}", file=sys.stderr)
                        status = 1
                        continue
                    else:
                        outcome = await _create(api, rt, doc)
                    print(f"{label} {outcome}")
                except HamiError as err:
                    print(f"{label}: {err}", file=sys.stderr)
                    status = 1
    finally:
        await admitter.close()
    if status:
        print(f"(stack: {where})", file=sys.stderr)
    return status


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        formatter_class=DefaultsHelp,
        prog="hami submit",
        description="Create the objects of YAML files in the running `hami up`'s cluster, as `kubectl create -f` "
        "does: pods through the webhook; namespaces, resource quotas, nodes and leases directly. Other kinds "
        "are skipped with the reason.",
    )
    parser.add_argument(
        "-f", "--filename", type=Path, action="append", required=True, help="a YAML file, or a folder of them"
    )
    add_dir_flag(parser)
    return parser


def submit_main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    try:
        return run_loop(_submit(args.workdir, args.filename))
    except HamiError as err:
        print(f"hami submit: {err}", file=sys.stderr)
        return 1
