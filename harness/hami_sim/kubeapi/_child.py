"""The child side of :class:`KubeApiProcess`: one emulator, driven by JSON lines on stdin, answers on stdout."""

from __future__ import annotations

import argparse
import logging
import sys

import msgspec

from hami_sim.kubeapi._errors import ApiError
from hami_sim.kubeapi._process import Command, Reply
from hami_sim.kubeapi._resources import find
from hami_sim.kubeapi._server import KubeApiEmulator

log = logging.getLogger("hami_sim.kubeapi")


def handle(api: KubeApiEmulator, command: Command) -> Reply:
    if command.op == "start":
        api.start()
        return Reply(ok=True, port=api.port)
    if command.op == "stop":
        api.stop()
        return Reply(ok=True)
    if command.op == "compact":
        return Reply(ok=True, value=api.compact())
    if command.op == "count":
        return Reply(ok=True, value=api.count(command.method, command.path))
    rt = find(command.group, command.version, command.plural)
    if rt is None:
        return Reply(ok=False, error=f"unknown resource {command.group}/{command.version}/{command.plural}")
    try:
        return Reply(ok=True, object=api.store.create(rt, command.namespace, command.body or {}))
    except ApiError as err:
        return Reply(ok=False, error=err.message)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bookmark-interval", type=float, default=1.0)
    parser.add_argument("--history", type=int, default=2000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    api = KubeApiEmulator(
        host=args.host, port=args.port, bookmark_interval=args.bookmark_interval, history=args.history
    )
    decoder = msgspec.json.Decoder(Command)
    out = sys.stdout.buffer
    try:
        for line in sys.stdin.buffer:  # ends when the parent closes our stdin or goes away
            try:
                reply = handle(api, decoder.decode(line))
            except msgspec.DecodeError as err:
                log.error("malformed command from the parent: %s", err)
                reply = Reply(ok=False, error=f"malformed command: {err}")
            except Exception as err:  # the parent gets the failure as an answer; the child keeps serving
                log.exception("command failed")
                reply = Reply(ok=False, error=str(err))
            out.write(msgspec.json.encode(reply) + b"\n")
            out.flush()
    finally:
        api.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
