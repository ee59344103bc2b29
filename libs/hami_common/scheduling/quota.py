"""Namespace GPU quota (hami-protocol §4.8): ``limits.<memory>`` and ``limits.<cores>`` of ResourceQuotas."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from hami_common.errors import InvalidInput
from hami_common.quantity import as_int
from hami_common.resources import GPU_CORES, GPU_MEMORY

__all__ = ["LIMITS_PREFIX", "NamespaceQuota", "quota_from_hard"]

LIMITS_PREFIX: Final = "limits."


@dataclass(frozen=True, slots=True)
class NamespaceQuota:
    """A namespace's tracked GPU limits (``None``: not set) and what its pods hold."""

    memory_limit: int | None = None
    cores_limit: int | None = None
    used_memory: int = 0
    used_cores: int = 0

    def fits(self, memory: int, cores: int, memory_factor: int = 1) -> bool:
        """HAMi's ``FitQuota``: an explicit limit of 0 blocks everything; no limit always passes."""
        if self.memory_limit is not None:
            limit = self.memory_limit * (memory_factor if memory_factor > 1 else 1)
            if self.used_memory + memory > limit:
                return False
        return self.cores_limit is None or self.used_cores + cores <= self.cores_limit

    def charged(self, memory: int, cores: int) -> NamespaceQuota:
        return replace(self, used_memory=self.used_memory + memory, used_cores=self.used_cores + cores)


def quota_from_hard(
    hards: Iterable[Mapping[str, str]], memory_name: str = GPU_MEMORY, core_name: str = GPU_CORES
) -> NamespaceQuota:
    """Limits from the ``spec.hard`` of a namespace's ResourceQuotas; only integer values count."""
    memory: int | None = None
    cores: int | None = None
    for hard in hards:
        for key, text in hard.items():
            if key not in (LIMITS_PREFIX + memory_name, LIMITS_PREFIX + core_name):
                continue
            try:
                number = as_int(text)
            except InvalidInput:
                number = None
            if number is None:
                continue
            if key == LIMITS_PREFIX + memory_name:
                memory = number
            else:
                cores = number
    return NamespaceQuota(memory_limit=memory, cores_limit=cores)
