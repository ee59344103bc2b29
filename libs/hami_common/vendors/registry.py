"""Which device families exist and which a device config enables: the one place a family is registered.

A family package registers a :class:`FamilySource` when it is imported: the device-config section it reads
and how that section (``None`` when absent) becomes its enabled families. :mod:`.builtin` imports the
families this project ships, one line each; adding a vendor is its package plus that line. Services never
name a family: they ask :func:`configured` through the device config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hami_common.errors import InvalidInput
from hami_common.vendors._family import DeviceFamily

__all__ = ["FamilySource", "configured", "plugin_modules", "register", "registered_sections"]


@dataclass(frozen=True, slots=True)
class FamilySource:
    section: str  # the device-config key, e.g. "vnpus", "cambricon"
    # the section as YAML decoded it (None for a bare key) -> the families it enables; InvalidInput when bad.
    # An absent section enables nothing (HAMi's chart writes every section it means to turn on).
    build: Callable[[object], tuple[DeviceFamily, ...]]
    # the module that plays the family's device plugin for declared (fake) devices (:mod:`..plugin`), if any;
    # imported only when a node service asks for it
    plugin: str = ""
    package: str = ""  # the family's package, which places a shipped family in :data:`.builtin.ORDER`


_SOURCES: dict[str, FamilySource] = {}


def register(source: FamilySource) -> FamilySource:
    """Called by a family package at import; registering the same section twice is a programming error."""
    known = _SOURCES.get(source.section)
    if known is not None and known is not source:
        raise RuntimeError(f"device-config section {source.section!r} is registered twice")
    _SOURCES[source.section] = source
    return source


def _sources() -> tuple[FamilySource, ...]:
    """The registered sources, the shipped ones in :data:`.builtin.ORDER` whichever was imported first (a
    test or a tool may import one family's package early), then the others in registration order."""
    from hami_common.vendors.builtin import ORDER  # importing it registers the shipped families

    rank = {package: i for i, package in enumerate(ORDER)}
    return tuple(sorted(_SOURCES.values(), key=lambda s: rank.get(s.package, len(rank))))


def plugin_modules() -> tuple[str, ...]:
    """The registered families' plugin modules, in registration order."""
    return tuple(s.plugin for s in _sources() if s.plugin)


def registered_sections() -> frozenset[str]:
    return frozenset(s.section for s in _sources())


def configured(sections: Mapping[str, object]) -> tuple[DeviceFamily, ...]:
    """Every family the device config's sections enable, in registration order; InvalidInput names the
    section of a bad value, and two families claiming one common word is refused."""
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
