"""Warnings for what a tenant most likely misspelt: beyond HAMi, and never a change to admission.

HAMi ignores a pod annotation or a resource it does not know, and reads a value outside a key's vocabulary
as some default: ``nvidia.com/use-gputyp`` is no type constraint, ``hami.io/gpu-scheduler-policy: binpak``
is spread, ``nvidia.com/vgpu-mode: MIG`` matches no card, and ``nvidia.com/gpumemory`` in limits is no GPU
memory at all. The webhook names such a pod's likely typos in AdmissionReview ``response.warnings``, which
kube-apiserver hands to the client as ``Warning`` headers (kubectl prints ``Warning: …``):

* an annotation key under a managed domain (``hami.io/``, ``nvidia.com/``, and the domains of every
  configured family's keys and resources) that no one defines but that is close to a key a tenant sets;
* a resource name under a managed resource domain, in any container's limits or requests, that is close to
  a known resource (every configured family's, NVIDIA's as configured);
* a known key whose value is outside its vocabulary (:data:`hami_common.annotations.keys.GPU_POLICIES` …).

Known keys, resources and vocabularies come from where the project defines them
(:mod:`hami_common.annotations.keys`, the :class:`~hami_common.resources.ResourceConfig`, each
:class:`~hami_common.vendors.DeviceFamily`); nothing is respelt here. Names are compared case-insensitively,
and "close" is :func:`difflib.get_close_matches` at :data:`CUTOFF`, so an unrelated name (``nvidia.com/
gpu.shared`` of the NVIDIA device plugin's time-slicing, say) gets no warning.

The pod is the tenant's, so the answer is bounded: at most :data:`MAX_WARNINGS` warnings (the last one then
says more were left out), at most :data:`MAX_EXAMINED` unknown names compared, the tenant's text shown escaped
(``repr`` where it is not printable) and cut at :data:`MAX_SHOWN` characters, and each warning cut at
:data:`MAX_WARNING_CHARS` (kube-apiserver's own cut once a response's warnings pass 4 KiB).
"""

from __future__ import annotations

import difflib
import enum
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from hami_common.annotations.keys import (
    BINPACK,
    GPU_POLICIES,
    GPU_SCHEDULER_POLICY,
    NODE_POLICIES,
    NODE_SCHEDULER_POLICY,
    POD_ANNOTATIONS,
    USER_POD_ANNOTATIONS,
    VGPU_MODE,
    VGPU_MODES,
)
from hami_common.resources import ContainerResources
from hami_common.vendors import DeviceFamily

__all__ = [
    "CUTOFF",
    "MAX_EXAMINED",
    "MAX_SHOWN",
    "MAX_WARNINGS",
    "MAX_WARNING_CHARS",
    "MORE_LEFT_OUT",
    "KnownNames",
    "known_names",
    "typo_warnings",
]

CUTOFF: Final = 0.85  # difflib's ratio over the whole lower-cased name, domain included
MAX_WARNINGS: Final = 8
MAX_EXAMINED: Final = 256  # unknown names under a managed domain compared with the known ones, per pod
MAX_SHOWN: Final = 64  # characters of a tenant's key, resource or value in a warning
MAX_WARNING_CHARS: Final = 256
MORE_LEFT_OUT: Final = f"more possible typos left out (at most {MAX_WARNINGS} warnings are given)"

UNKNOWN_ANNOTATION: Final = "unknown annotation {key}; did you mean {known}?"
UNKNOWN_RESOURCE: Final = "unknown resource {resource} in container {container}; did you mean {known}?"
OUT_OF_VOCABULARY: Final = "annotation {key}: {value} is not one of {accepted} ({effect})"
DID_YOU_MEAN: Final = "; did you mean {known}?"


class _Reading(enum.Enum):
    """How HAMi reads a key's value against its vocabulary."""

    WHOLE = "the whole value"
    CHAIN = "each part of a comma-separated chain, trimmed"
    CONTAINS = "the value contains a word"


@dataclass(frozen=True, slots=True)
class _Vocabulary:
    words: tuple[str, ...]
    reading: _Reading
    effect: str  # what HAMi makes of a value outside it


_VOCABULARIES: Final[Mapping[str, _Vocabulary]] = {
    NODE_SCHEDULER_POLICY: _Vocabulary(NODE_POLICIES, _Reading.WHOLE, f"it reads as {BINPACK}"),
    GPU_SCHEDULER_POLICY: _Vocabulary(GPU_POLICIES, _Reading.CHAIN, "it is ignored"),
    VGPU_MODE: _Vocabulary(VGPU_MODES, _Reading.CONTAINS, "no card's mode matches it"),
}


def _domain(name: str) -> str | None:
    domain, slash, _ = name.partition("/")
    return domain if slash and domain else None


@dataclass(frozen=True, slots=True)
class KnownNames:
    """What the configured webhook knows: every pod annotation key (no warning), the ones a tenant sets (what
    an unknown key is compared with: a key only the system writes is never a tenant's intent), and every
    resource name."""

    annotations: frozenset[str]
    user_annotations: frozenset[str]
    resources: frozenset[str]


@dataclass(frozen=True)
class _Index:
    """Known names by lower case, and the domains under which an unknown name is compared with them."""

    by_lower: Mapping[str, str]
    lowered: tuple[str, ...]
    domains: frozenset[str]

    @classmethod
    def of(cls, names: Iterable[str], domains: frozenset[str]) -> _Index:
        by_lower = {name.lower(): name for name in sorted(names)}
        return cls(by_lower, tuple(by_lower), domains)

    def closest(self, name: str) -> str | None:
        lower = name.lower()
        if lower in self.by_lower:
            return self.by_lower[lower]
        found = difflib.get_close_matches(lower, self.lowered, n=1, cutoff=CUTOFF)
        return self.by_lower[found[0]] if found else None


@functools.lru_cache(maxsize=8)
def known_names(families: tuple[DeviceFamily, ...]) -> KnownNames:
    """Every pod annotation key and resource name of the configured families; built once per configuration."""
    annotations = set(POD_ANNOTATIONS)
    users = set(USER_POD_ANNOTATIONS)
    resources: set[str] = set()
    for family in families:
        annotations |= family.user_annotations | family.owned_annotations
        users |= family.user_annotations
        resources.update(family.resource_names)
    return KnownNames(frozenset(annotations), frozenset(users), frozenset(resources))


@functools.lru_cache(maxsize=8)
def _indexes(known: KnownNames) -> tuple[_Index, _Index]:
    """(annotations, resources); built once per configuration."""
    resource_domains = frozenset(d for d in map(_domain, known.resources) if d)
    annotation_domains = frozenset(d for d in map(_domain, known.annotations) if d) | resource_domains
    return _Index.of(known.user_annotations, annotation_domains), _Index.of(known.resources, resource_domains)


def _shown(text: str) -> str:
    """A tenant's text as a warning shows it: cut, and escaped unless every character is printable."""
    cut = text[:MAX_SHOWN]
    shown = cut if cut.isprintable() and cut.strip() == cut and cut else repr(cut)
    return shown + "…" if len(text) > MAX_SHOWN else shown


def _value_warning(key: str, value: str, vocabulary: _Vocabulary) -> str | None:
    words = vocabulary.words
    if vocabulary.reading is _Reading.CHAIN:
        parts = [part.strip() for part in value.split(",")]
        bad = [part for part in parts if part and part not in words]
    elif vocabulary.reading is _Reading.CONTAINS:
        bad = [] if any(word in value for word in words) else [value]
    else:
        bad = [] if value in words else [value]
    if not bad:
        return None
    accepted = ", ".join(words)
    text = OUT_OF_VOCABULARY.format(key=key, value=_shown(bad[0]), accepted=accepted, effect=vocabulary.effect)
    lowered = {word.lower(): word for word in words}
    found = difflib.get_close_matches(bad[0].strip().lower(), list(lowered), n=1, cutoff=0.6)
    return text + DID_YOU_MEAN.format(known=lowered[found[0]]) if found else text


def _findings(
    annotations: Mapping[str, str], containers: Sequence[ContainerResources], known: KnownNames
) -> Iterator[str]:
    annotation_index, resource_index = _indexes(known)
    examined = 0
    for key, value in annotations.items():
        vocabulary = _VOCABULARIES.get(key)
        if vocabulary is not None:
            if value:  # empty is unset: the default applies
                warning = _value_warning(key, value, vocabulary)
                if warning is not None:
                    yield warning
            continue
        if key in known.annotations or _domain(key) not in annotation_index.domains:
            continue
        examined += 1
        if examined > MAX_EXAMINED:
            return
        close = annotation_index.closest(key)
        if close is not None:
            yield UNKNOWN_ANNOTATION.format(key=_shown(key), known=close)
    for ctr in containers:
        for resource in dict.fromkeys((*ctr.limits, *ctr.requests)):
            if resource in known.resources or _domain(resource) not in resource_index.domains:
                continue
            examined += 1
            if examined > MAX_EXAMINED:
                return
            close = resource_index.closest(resource)
            if close is not None:
                yield UNKNOWN_RESOURCE.format(resource=_shown(resource), container=_shown(ctr.name), known=close)


def typo_warnings(
    annotations: Mapping[str, str], containers: Sequence[ContainerResources], known: KnownNames
) -> tuple[str, ...]:
    """The pod's likely typos as warning texts, in the pod's order, bounded (see the module docstring).

    ``containers`` are every container's resources (init, app and ephemeral). Pure; never raises.
    """
    found: dict[str, None] = {}
    for full in _findings(annotations, containers, known):
        warning = full[:MAX_WARNING_CHARS]
        if warning in found:
            continue
        if len(found) == MAX_WARNINGS:
            found.popitem()
            found[MORE_LEFT_OUT] = None
            break
        found[warning] = None
    return tuple(found)
