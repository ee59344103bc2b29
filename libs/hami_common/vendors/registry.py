"""Which device families exist and which a device config enables: the one place a family is found.

A family package offers one :class:`FamilySource` (the device-config section it reads and how that section,
``None`` when absent, becomes its enabled families) and names it in its distribution's ``hami.vendors``
entry-point group (pyproject.toml)::

    [project.entry-points."hami.vendors"]
    metax = "hami_metax:SOURCE"

This module loads that group the first time a family is asked for; it imports no family itself, so a
family package may import it without an import circle. Adding a vendor is its package plus that line.
Services never name a family: they ask :func:`configured` through the device config.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Final

from hami_common.errors import InvalidInput
from hami_common.vendors._family import DeviceFamily

__all__ = [
    "ENTRY_POINT_GROUP",
    "FamilySource",
    "configured",
    "plugin_modules",
    "registered_sections",
]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP: Final = "hami.vendors"


@dataclass(frozen=True, slots=True)
class FamilySource:
    section: str  # the device-config key, e.g. "vnpus", "cambricon"
    # the section as YAML decoded it (None for a bare key) -> the families it enables; InvalidInput when bad.
    # An absent section enables nothing (HAMi's chart writes every section it means to turn on).
    build: Callable[[object], tuple[DeviceFamily, ...]]
    # the module that plays the family's device plugin for declared (fake) devices (:mod:`..plugin`), if any;
    # imported only when a node service asks for it
    plugin: str = ""
    # where the family's devices are listed among the others (in the placement table, in a node's registration
    # order, ...): lower first, then by section; the shipped families take 10, 20, 30
    rank: int = 100


_SOURCES: dict[str, FamilySource] = {}
_loaded = False


def _register(source: FamilySource) -> None:
    """Two distributions offering one device-config section is refused."""
    known = _SOURCES.get(source.section)
    if known is not None and known is not source:
        raise RuntimeError(f"device-config section {source.section!r} is registered twice")
    _SOURCES[source.section] = source


def _load_entry_points() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for point in entry_points(group=ENTRY_POINT_GROUP):
        source = point.load()
        if not isinstance(source, FamilySource):
            raise TypeError(f"entry point {point.name} = {point.value} ({ENTRY_POINT_GROUP}) is not a FamilySource")
        _register(source)
    if not _SOURCES:
        # only a checkout used without installing it (pip install -e .) has no entry points
        log.warning("no device family found in the %r entry points: is the package installed?", ENTRY_POINT_GROUP)


def _sources() -> tuple[FamilySource, ...]:
    _load_entry_points()
    return tuple(sorted(_SOURCES.values(), key=lambda s: (s.rank, s.section)))


def plugin_modules() -> tuple[str, ...]:
    """The registered families' plugin modules, in their order."""
    return tuple(s.plugin for s in _sources() if s.plugin)


def registered_sections() -> frozenset[str]:
    return frozenset(s.section for s in _sources())


def configured(sections: Mapping[str, object]) -> tuple[DeviceFamily, ...]:
    """Every family the device config's sections enable, in their order; InvalidInput names the section of a
    bad value, and two families claiming one common word is refused."""
    families: list[DeviceFamily] = []
    for source in _sources():
        if source.section not in sections:
            continue
        try:
            families.extend(source.build(sections[source.section]))
        except InvalidInput as err:
            text = str(err)
            raise InvalidInput(text if text.startswith(source.section) else f"{source.section}: {text}") from err
    words = [f.word for f in families]
    twice = sorted({w for w in words if words.count(w) > 1})
    if twice:
        raise InvalidInput(f"device family {twice[0]!r} is enabled by two sections")
    return tuple(families)
