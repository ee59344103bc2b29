"""hami: the operator's command. `hami <command> --help` describes each command's flags."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Final

__all__ = ["COMMANDS", "DEBUG_ENV", "main", "version"]

DEBUG_ENV: Final = "HAMI_DEBUG"  # set (to anything) to see the traceback of an unexpected error
EXIT_INTERRUPTED: Final = 130  # as a shell reports a command ended by Ctrl-C

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
    parser.add_argument("--version", action="version", version=f"hami {version()}")
    parser.add_argument("command", choices=list(COMMANDS), metavar="command", help=", ".join(COMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own flags")
    return parser


def _quiet_logging() -> None:
    """The client commands print their own one-line errors; library warnings (urllib3's retries) are noise."""
    logging.basicConfig(level=logging.ERROR, format="hami: %(message)s")


def in_checkout() -> bool:
    """Whether this runs from a checkout of the repository (``hami up`` needs its deploy/, examples/, native/)."""
    return (Path(__file__).resolve().parents[2] / "deploy").is_dir()


def _not_in_checkout(_: list[str]) -> int:
    print(
        "hami up: it runs the whole system from a checkout of the repository (its deploy/, examples/ and native/ "
        "folders): clone it and run `make run` there; this install has the operator's commands (status, submit, "
        "decode)",
        file=sys.stderr,
    )
    return 1


def _run(command: str) -> Callable[[list[str]], int]:
    if command == "up":
        if not in_checkout():
            return _not_in_checkout
        from hami_cli.up import main as up

        return up
    _quiet_logging()
    if command == "submit":
        from hami_cli.submit import submit_main

        return submit_main
    if command == "status":
        from hami_cli.status import status_main

        return status_main
    from hami_cli.decode import decode_main

    return decode_main


def version() -> str:
    try:
        return metadata.version("hami-py")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        _parser().parse_args(args)  # prints the help or the version (rc 0), or the usage and the error (rc 2)
        return 2
    command = args[0]
    try:
        return _run(command)(args[1:])
    except KeyboardInterrupt:
        print(f"hami {command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        # Every expected failure (a bad file, an unreachable cluster, a timeout) is reported by the command
        # itself with what to do; reaching here is a bug of ours, so say where its traceback is.
        if os.environ.get(DEBUG_ENV):
            traceback.print_exc()
        print(
            f"hami {command}: unexpected error: {type(err).__name__}: {err} "
            f"(this is a bug; {DEBUG_ENV}=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1
