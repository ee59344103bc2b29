"""How long each pod's /filter took, kept until its bind reports it on the placement decision."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FilterTimes"]


@dataclass(eq=False)
class FilterTimes:
    """Bounded: pods that are filtered and never bound age out, oldest first."""

    limit: int = 10_000
    _ns: dict[str, int] = field(default_factory=dict)

    def record(self, uid: str, ns: int) -> None:
        self._ns.pop(uid, None)  # filtered again: the latest call counts, and it is now the newest
        self._ns[uid] = ns
        if len(self._ns) > self.limit:
            del self._ns[next(iter(self._ns))]

    def take(self, uid: str) -> int | None:
        return self._ns.pop(uid, None)
