"""Where a running ``hami up`` is: a small JSON file in its work directory, read by ``hami submit``/``status``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Final

import msgspec

__all__ = ["STATE_FILE", "UpState", "default_workdir", "read_state", "write_state"]

STATE_FILE: Final = "hami-up.json"


class UpState(msgspec.Struct, frozen=True, kw_only=True):
    api_url: str
    kubeconfig: str
    webhook_url: str
    ca_file: str
    metrics_url: str
    nats_url: str
    kube: str = "emulated"  # or "real": kube-apiserver over TLS, which calls the webhook itself
    api_ca: str = ""  # real: the CA, certificate and key that admin requests present
    client_cert: str = ""
    client_key: str = ""


def default_workdir() -> Path:
    """One per user, so ``hami submit`` in another terminal finds the running stack without flags."""
    return Path(tempfile.gettempdir()) / f"hami-up-{os.getuid()}"


def write_state(workdir: Path, state: UpState) -> Path:
    path = workdir / STATE_FILE
    path.write_bytes(msgspec.json.encode(state))
    return path


def read_state(workdir: Path) -> UpState:
    """The running stack's addresses; FileNotFoundError when none runs there."""
    return msgspec.json.decode((workdir / STATE_FILE).read_bytes(), type=UpState)
