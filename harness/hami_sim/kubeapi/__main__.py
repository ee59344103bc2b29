"""``python -m hami_sim.kubeapi --port 6443 --kubeconfig run/kubeconfig``: serve until interrupted."""

from __future__ import annotations

import argparse
import contextlib
import threading

from hami_sim.kubeapi._server import KubeApiEmulator


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6443)
    parser.add_argument("--kubeconfig", default="kubeconfig", help="where to write the kubeconfig")
    args = parser.parse_args(argv)
    with KubeApiEmulator(host=args.host, port=args.port) as api:
        path = api.write_kubeconfig(args.kubeconfig)
        print(f"Kubernetes API emulator on {api.url}; kubeconfig: {path}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
