"""The Prometheus text exposition format (version 0.0.4), written directly from metric families.

Rendering is the scrape's whole cost at a thousand nodes (hundreds of thousands of lines), so a
:class:`TextRenderer` (one per app instance) keeps work between scrapes:

* for a :class:`RowGroup`, the finished lines of each immutable record (a container's usage report, a pod's
  placement, a GPU's host sample), reused while the record stays in the state: a scrape formats only the
  records replaced since the last one, and slices the others' lines into their families;
* for plain families, the escaped label part of each series (``{node="…",zone="vGPU"}``).

What a scrape did not render is dropped from the caches at its end.
``benchmarks/metrics_scrape.py`` compares this with prometheus_client's encoder.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Final

from hami_metrics.exposition import AnyFamily, Cell, Family, HistogramFamily, RowGroup
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
_RowCache = dict[int, tuple[object, tuple[str, ...]]]  # id(record) -> (record, its line per family)


class TextRenderer:
    """Renders families to bytes; thread-safe (one render at a time), so a scrape may run in a worker."""

    def __init__(self) -> None:
        self._labels: dict[_LabelKey, dict[tuple[str, ...], str]] = {}
        self._rows: dict[tuple[FamilySpec, ...], _RowCache] = {}
        self._lock = threading.Lock()

    def render(self, families: Iterable[AnyFamily]) -> bytes:
        with self._lock:
            out: list[str] = []
            texts: dict[tuple[int, _LabelKey], list[str]] = {}  # this scrape: a series list's label texts
            rows: dict[tuple[FamilySpec, ...], _RowCache] = {}
            rendered = 0
            for family in families:
                if isinstance(family, RowGroup):
                    self._row_group(out, family, rows)
                    continue
                out.append(_header(family.spec))
                if isinstance(family, Family):
                    rendered += self._samples(out, family, texts)
                else:
                    rendered += _histograms(out, family)
            self._rows = rows
            cached = sum(len(c) for c in self._labels.values())
            if cached > max(_CACHE_SLACK * rendered, _CACHE_FLOOR):
                self._labels.clear()
            return "".join(out).encode()

    def _row_group(
        self, out: list[str], group: RowGroup[object], caches: dict[tuple[FamilySpec, ...], _RowCache]
    ) -> None:
        specs = group.specs
        old = self._rows.get(specs, {})
        new: _RowCache = {}
        rows: list[tuple[str, ...]] = []
        for record in group.records:
            key = id(record)
            hit = old.get(key)
            if hit is None or hit[0] is not record:
                hit = (record, _row_lines(specs, group.row(record)))
            new[key] = hit  # holding the record keeps its id from being reused while it is cached
            rows.append(hit[1])
        caches[specs] = new
        for i, spec in enumerate(specs):
            out.append(_header(spec))
            out.extend([lines[i] for lines in rows])  # "" where a record has no sample: adds nothing

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


def _header(spec: FamilySpec) -> str:
    return f"# HELP {spec.name} {escape_help(spec.help)}\n# TYPE {spec.name} {spec.kind}\n"


def _row_lines(specs: tuple[FamilySpec, ...], cells: tuple[Cell, ...]) -> tuple[str, ...]:
    """One record's line per family ("" where it has none); consecutive families with the same label
    names and series share one escaped label text."""
    lines = []
    last: tuple[tuple[str, ...], tuple[tuple[str, str], ...], tuple[str, ...]] | None = None
    text = ""
    for spec, cell in zip(specs, cells, strict=True):
        if cell is None:
            lines.append("")
            continue
        values, value = cell
        if last is None or last[0] is not spec.labels or last[1] is not spec.const_labels or last[2] is not values:
            text = _label_text(spec.labels, values, spec.const_labels)
            last = (spec.labels, spec.const_labels, values)
        lines.append(f"{spec.name}{text} {value}\n")
    return tuple(lines)


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
