"""The Prometheus text exposition format (version 0.0.4), written directly from metric families.

Rendering is the scrape's whole cost at a thousand nodes, so the label part of each series
(``{node="…",device_uuid="…",zone="vGPU"}``) is escaped once and kept between scrapes: a
:class:`TextRenderer` belongs to one app instance and forgets what it cached when the cache grows well
beyond the series it last rendered. ``benchmarks/metrics_scrape.py`` compares this with prometheus_client.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Final

from hami_metrics.exposition import AnyFamily, Family, HistogramFamily
from hami_metrics.families import FamilySpec

__all__ = ["CONTENT_TYPE", "TextRenderer", "escape_help", "escape_label_value"]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
_CACHE_SLACK: Final = 2  # keep cached label parts while they are fewer than twice the rendered series
_CACHE_FLOOR: Final = 10_000


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _format_float(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _label_text(names: tuple[str, ...], values: tuple[str, ...], const: tuple[tuple[str, str], ...]) -> str:
    pairs = [f'{n}="{escape_label_value(v)}"' for n, v in zip(names, values, strict=True)]
    pairs += [f'{n}="{escape_label_value(v)}"' for n, v in const]
    return "{" + ",".join(pairs) + "}" if pairs else ""


_LabelKey = tuple[tuple[str, ...], tuple[tuple[str, str], ...]]  # label names, constant labels


class TextRenderer:
    """Renders families to bytes; thread-safe (one render at a time), so a scrape may run in a worker."""

    def __init__(self) -> None:
        self._labels: dict[_LabelKey, dict[tuple[str, ...], str]] = {}
        self._lock = threading.Lock()

    def render(self, families: Iterable[AnyFamily]) -> bytes:
        with self._lock:
            out: list[str] = []
            texts: dict[tuple[int, _LabelKey], list[str]] = {}  # this scrape: a series list's label texts
            rendered = 0
            for family in families:
                spec = family.spec
                out.append(f"# HELP {spec.name} {escape_help(spec.help)}\n# TYPE {spec.name} {spec.kind}\n")
                if isinstance(family, Family):
                    rendered += self._samples(out, family, texts)
                else:
                    rendered += _histograms(out, family)
            cached = sum(len(c) for c in self._labels.values())
            if cached > max(_CACHE_SLACK * rendered, _CACHE_FLOOR):
                self._labels.clear()
            return "".join(out).encode()

    def _label_texts(self, spec: FamilySpec, series: list[tuple[str, ...]]) -> list[str]:
        key = (spec.labels, spec.const_labels)
        cache = self._labels.get(key)
        if cache is None:
            cache = self._labels[key] = {}
        texts = []
        for values in series:
            text = cache.get(values)
            if text is None:
                text = cache[values] = _label_text(spec.labels, values, spec.const_labels)
            texts.append(text)
        return texts

    def _samples(self, out: list[str], family: Family, memo: dict[tuple[int, _LabelKey], list[str]]) -> int:
        spec = family.spec
        memo_key = (id(family.series), (spec.labels, spec.const_labels))
        texts = memo.get(memo_key)
        if texts is None:
            texts = memo[memo_key] = self._label_texts(spec, family.series)
        name = spec.name
        # Values are ints or finite floats (collect never divides by zero); Python's shortest float repr is
        # what Prometheus' parser reads back exactly.
        out.extend([f"{name}{labels} {value}\n" for labels, value in zip(texts, family.values, strict=True)])
        return len(texts)


def _histograms(out: list[str], family: HistogramFamily) -> int:
    spec = family.spec
    name, const = spec.name, spec.const_labels
    rendered = 0
    for values, hist in family.series:
        bounds = [_format_float(b) for b in hist.bounds] + ["+Inf"]
        for bound, n in zip(bounds, hist.cumulative(), strict=True):
            labels = _label_text((*spec.labels, "le"), (*values, bound), const)
            out.append(f"{name}_bucket{labels} {n}\n")
        labels = _label_text(spec.labels, values, const)
        out.append(f"{name}_sum{labels} {_format_float(hist.total)}\n")
        out.append(f"{name}_count{labels} {hist.count}\n")
        rendered += len(bounds) + 2
    return rendered
