"""hami: the operator's command. `hami <command> --help` describes each command's flags."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Final

__all__ = ["COMMANDS", "main"]

# command -> what it does, shown by `hami --help`
COMMANDS: Final[dict[str, str]] = {
    "up": "run the whole system on this machine (NATS, the Kubernetes API, every service, simulated GPU "
    "nodes) until Ctrl-C; each run has its own work directory",
    "submit": "create the objects of YAML files (-f FILE or folder) in the running `hami up`: pods through "
    "the webhook, and namespaces, quotas, nodes and leases",
    "status": "GPU overview: nodes, GPUs, memory and cores booked and used, slices, the pods on each and why "
    "pending pods wait; the local stack, or any cluster with --kubeconfig/--context/--in-cluster; -o json",
    "decode": "explain a HAMi annotation value (hami decode KEY VALUE) as JSON; `hami decode --help` lists the keys",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hami",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {name:<8}{text}" for name, text in COMMANDS.items()),
    )
    parser.add_argument("command", choices=list(COMMANDS), metavar="command", help=", ".join(COMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own flags")
    return parser


def _quiet_logging() -> None:
    """The client commands print their own one-line errors; library warnings (urllib3's retries) are noise."""
    logging.basicConfig(level=logging.ERROR, format="hami: %(message)s")


def _run(command: str) -> Callable[[list[str]], int]:
    if command == "up":
        from hami_cli.up import main as up

        return up
    _quiet_logging()
    if command == "submit":
        from hami_cli.submit import submit_main

        return submit_main
    if command == "status":
        from hami_cli.submit import status_main

        return status_main
    from hami_cli.decode import decode_main

    return decode_main


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        _parser().parse_args(args)  # prints the help (rc 0) or the usage and the error (rc 2)
        return 2
    return _run(args[0])(args[1:])
