"""``hami up``: the whole system on one machine, on an embedded default.

It starts a real ``nats-server`` and the Kubernetes API emulator, writes the emulated cluster's
kubeconfig, then starts every service of this checkout that is installed as a separate process
pointed at both, and supervises them until Ctrl-C (or ``--for`` seconds), when it stops everything.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from hami_common.bus import EmbeddedNats
from hami_common.settings import env_name
from hami_sim.kubeapi import KubeApiEmulator

__all__ = ["Stack", "main"]

log = logging.getLogger(__name__)

# Control-plane services `hami up` runs, by console script and the module that proves it is installed.
SERVICES: Final = (
    ("hami-webhook", "hami_webhook.main"),
    ("hami-extender", "hami_extender.main"),
    ("hami-metrics", "hami_metrics.main"),
)
_STOP_TIMEOUT_S: Final = 10.0


@dataclass
class Stack:
    """The running pieces; ``start`` and ``stop`` are idempotent."""

    workdir: Path
    nats: EmbeddedNats = field(default_factory=EmbeddedNats)
    kube: KubeApiEmulator = field(default_factory=KubeApiEmulator)
    children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env[env_name("nats_url")] = self.nats.url
        env[env_name("kubeconfig")] = str(self.kubeconfig)
        return env

    def start(self, services: Sequence[str]) -> None:
        self.nats.start()
        self.kube.start()
        self.kube.write_kubeconfig(self.kubeconfig)
        bindir = Path(sys.executable).parent
        for script, module in SERVICES:
            name = script.removeprefix("hami-")
            if name not in services:
                continue
            path = shutil.which(script, path=str(bindir)) or shutil.which(script)
            if path is None or importlib.util.find_spec(module) is None:
                log.warning("%s is not installed in this checkout; skipped", script)
                continue
            logfile = (self.workdir / f"{name}.log").open("ab")
            self.children[name] = subprocess.Popen(
                [path], env=self.environment(), stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def exited(self) -> dict[str, int]:
        return {name: code for name, proc in self.children.items() if (code := proc.poll()) is not None}

    def stop(self) -> None:
        for proc in self.children.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.children.values():
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.children.clear()
        self.kube.stop()
        self.nats.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hami up", description=__doc__)
    parser.add_argument("--workdir", type=Path, help="where kubeconfig and logs go (default: a new temp dir)")
    parser.add_argument(
        "--services",
        default=",".join(s.removeprefix("hami-") for s, _ in SERVICES),
        help="comma-separated control-plane services to run",
    )
    parser.add_argument("--for", dest="duration", type=float, help="stop by itself after this many seconds")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="hami-up-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stack = Stack(workdir=workdir)
    done = threading.Event()
    try:
        print("starting nats-server and the Kubernetes API emulator ...", flush=True)
        stack.start([s.strip() for s in args.services.split(",") if s.strip()])
        print(f"NATS:        {stack.nats.url}")
        print(f"Kubernetes:  {stack.kube.url}")
        print(f"kubeconfig:  {stack.kubeconfig}   (kubectl --kubeconfig {stack.kubeconfig} get nodes,pods)")
        print(f"services:    {', '.join(stack.children) or 'none installed yet'}; logs in {workdir}")
        print("Ctrl-C stops everything.", flush=True)
        while not done.wait(timeout=0.5):
            for name, code in stack.exited().items():
                print(f"{name} exited with {code}; see {workdir / (name + '.log')}", flush=True)
                del stack.children[name]
            if args.duration is not None:
                args.duration -= 0.5
                if args.duration <= 0:
                    done.set()
    except KeyboardInterrupt:
        print("stopping ...", flush=True)
    finally:
        stack.stop()
    print("stopped.", flush=True)
    return 0
