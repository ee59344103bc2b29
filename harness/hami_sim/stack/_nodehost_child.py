"""``python -m hami_sim.stack._nodehost_child``: the child side of :class:`~hami_sim.stack._nodehost.NodeHost`.

A module of its own so that running it does not import it a second time through the ``hami_sim.stack`` package.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

import msgspec

from hami_common.service import run_loop
from hami_sim.stack._nodehost import HostProcess, HostSpec


async def _child_main() -> None:
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader(limit=1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    first = await commands.readline()
    spec = msgspec.json.decode(first, type=HostSpec)
    stdout = sys.stdout.buffer

    def out(message: msgspec.Struct) -> None:
        stdout.write(msgspec.json.encode(message) + b"\n")
        stdout.flush()

    await HostProcess(spec, out).run(commands)


def main() -> int:
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches the whole process group; the parent stops us
        run_loop(_child_main())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
