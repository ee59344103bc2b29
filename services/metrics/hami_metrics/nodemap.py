"""An immutable mapping whose update copies one small bucket instead of the whole map.

The cluster state is replaced on every bus event; with a plain dict of a thousand nodes, copying the
dict was most of the cost of folding a usage sample. :class:`NodeMap` spreads its keys over a fixed number
of buckets, so :meth:`NodeMap.set` copies one bucket (a few dozen entries) and the tuple of buckets.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Final, Generic, TypeVar, overload

__all__ = ["NodeMap"]

V = TypeVar("V")
D = TypeVar("D")
_BUCKETS: Final = 64
_MASK: Final = _BUCKETS - 1


class NodeMap(Mapping[str, V], Generic[V]):
    __slots__ = ("_buckets", "_len")

    def __init__(self, items: Iterable[tuple[str, V]] = ()) -> None:
        buckets: list[dict[str, V]] = [{} for _ in range(_BUCKETS)]
        for key, value in items:
            buckets[hash(key) & _MASK][key] = value
        self._buckets: tuple[dict[str, V], ...] = tuple(buckets)
        self._len = sum(len(b) for b in buckets)

    @classmethod
    def _of(cls, buckets: tuple[dict[str, V], ...], length: int) -> NodeMap[V]:
        new: NodeMap[V] = cls.__new__(cls)
        new._buckets = buckets
        new._len = length
        return new

    def set(self, key: str, value: V) -> NodeMap[V]:
        """A new map with ``key`` bound to ``value``; this one is unchanged."""
        slot = hash(key) & _MASK
        bucket = dict(self._buckets[slot])
        grew = key not in bucket
        bucket[key] = value
        buckets = (*self._buckets[:slot], bucket, *self._buckets[slot + 1 :])
        return self._of(buckets, self._len + grew)

    def __getitem__(self, key: str) -> V:
        return self._buckets[hash(key) & _MASK][key]

    @overload
    def get(self, key: str, /) -> V | None: ...
    @overload
    def get(self, key: str, /, default: V | D) -> V | D: ...
    def get(self, key: str, /, default: object = None) -> object:
        return self._buckets[hash(key) & _MASK].get(key, default)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._buckets[hash(key) & _MASK]

    def __iter__(self) -> Iterator[str]:
        for bucket in self._buckets:
            yield from bucket

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"NodeMap({dict(self.items())!r})"
