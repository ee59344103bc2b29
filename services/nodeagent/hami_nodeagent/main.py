"""``hami-nodeagent``: one per GPU node (see :mod:`hami_nodeagent.agent`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hami_common import service
from hami_common.errors import InvalidInput
from hami_nodeagent.agent import COMPONENT, serve
from hami_nodeagent.settings import NodeAgentSettings

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return service.run(NodeAgentSettings, serve, argv, name=COMPONENT)
    except InvalidInput as err:  # found at start-up (inventory file, node config): one line, like a bad flag
        logging.getLogger(COMPONENT).error("bad configuration: %s", err)
        return service.EXIT_CONFIG


if __name__ == "__main__":
    raise SystemExit(main())
