"""``hami``: the operator's command. ``hami up`` runs the local stack, ``hami submit -f pod.yaml`` and
``hami status`` talk to it, ``hami decode KEY VALUE`` explains a HAMi annotation value."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hami_common.errors import AnnotationError

__all__ = ["main"]

COMMANDS = ("up", "submit", "status", "decode")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="hami", description=__doc__)
    parser.add_argument("command", choices=COMMANDS)
    if not args or args[0] not in COMMANDS:
        parser.parse_args(args)  # prints usage and exits 2 (or 0 for --help)
        return 2
    if args[0] == "up":
        from hami_cli.up import main as up

        return up(args[1:])
    if args[0] == "submit":
        from hami_cli.submit import submit_main

        return submit_main(args[1:])
    if args[0] == "status":
        from hami_cli.submit import status_main

        return status_main(args[1:])
    from hami_cli.decode import DECODERS, decode

    sub = argparse.ArgumentParser(prog="hami decode", description="decode a HAMi annotation value")
    sub.add_argument("key", choices=sorted(DECODERS))
    sub.add_argument("value")
    parsed = sub.parse_args(args[1:])
    try:
        sys.stdout.write(decode(parsed.key, parsed.value).decode() + "\n")
    except AnnotationError as err:
        print(f"hami decode: {err}", file=sys.stderr)
        return 1
    return 0
