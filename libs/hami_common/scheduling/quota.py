"""Namespace GPU quota (hami-protocol §4.8): ``limits.<memory>`` and ``limits.<cores>`` of ResourceQuotas."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from hami_common.errors import InvalidInput
from hami_common.quantity import as_int
from hami_common.resources import GPU_CORES, GPU_MEMORY

__all__ = ["LIMITS_PREFIX", "NamespaceQuota", "QuotaExcess", "QuotaField", "quota_from_hard"]

LIMITS_PREFIX: Final = "limits."


class QuotaField(enum.StrEnum):
    MEMORY = "memory"  # MiB (the memory resource times the family's memory factor)
    CORES = "cores"


@dataclass(frozen=True, slots=True)
class QuotaExcess:
    """Which limit a request would pass: the request, what the namespace holds, and the limit (memory in MiB)."""

    field: QuotaField
    requested: int
    used: int
    limit: int


@dataclass(frozen=True, slots=True)
class NamespaceQuota:
    """A namespace's tracked GPU limits (``None``: not set) and what its pods hold."""

    memory_limit: int | None = None
    cores_limit: int | None = None
    used_memory: int = 0
    used_cores: int = 0

    def fits(self, memory: int, cores: int, memory_factor: int = 1) -> bool:
        """HAMi's ``FitQuota``: an explicit limit of 0 blocks everything; no limit always passes."""
        return self.excess(memory, cores, memory_factor) is None

    def excess(self, memory: int, cores: int, memory_factor: int = 1) -> QuotaExcess | None:
        """The first limit (memory, then cores, as HAMi checks them) the request would pass; None when it fits."""
        if self.memory_limit is not None:
            limit = self.memory_limit * (memory_factor if memory_factor > 1 else 1)
            if self.used_memory + memory > limit:
                return QuotaExcess(QuotaField.MEMORY, memory, self.used_memory, limit)
        if self.cores_limit is not None and self.used_cores + cores > self.cores_limit:
            return QuotaExcess(QuotaField.CORES, cores, self.used_cores, self.cores_limit)
        return None

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
