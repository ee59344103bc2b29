"""``hami-allocator``: the kubelet device plugin."""

from __future__ import annotations

from collections.abc import Sequence

from hami_allocator.service import serve
from hami_allocator.settings import AllocatorSettings
from hami_common import service

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    return service.run(AllocatorSettings, serve, argv, name="hami-allocator")


if __name__ == "__main__":
    raise SystemExit(main())
