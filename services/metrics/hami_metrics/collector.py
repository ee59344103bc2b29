"""The same families through prometheus_client: a Collector for a per-instance registry.

The service renders with :class:`hami_metrics.textformat.TextRenderer`, which is several times faster at
a thousand nodes (``benchmarks/metrics_scrape.py`` measures both). This adapter stays as the reference:
tests check that both encodings parse to the same samples, and an embedding process that already runs a
prometheus_client registry can register it there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.registry import Collector

from hami_metrics.exposition import AnyFamily, Family, HistogramFamily, RowGroup
from hami_metrics.families import Kind

__all__ = ["FamilyCollector"]


class FamilyCollector(Collector):
    """Collects whatever ``source()`` returns at scrape time; register it on a ``CollectorRegistry()``."""

    def __init__(self, source: Callable[[], list[AnyFamily]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for item in self._source():
            for family in item.families() if isinstance(item, RowGroup) else (item,):
                yield _metric(family)


def _metric(family: Family | HistogramFamily) -> Metric:
    spec = family.spec
    names = [*spec.labels, *(n for n, _ in spec.const_labels)]
    const = [v for _, v in spec.const_labels]
    if isinstance(family, HistogramFamily):
        histogram = HistogramMetricFamily(spec.name, spec.help, labels=names)
        for values, hist in family.series:
            bounds = [repr(b) for b in hist.bounds] + ["+Inf"]
            buckets = list(zip(bounds, hist.cumulative(), strict=True))
            histogram.add_metric([*values, *const], buckets, hist.total)
        return histogram
    metric: GaugeMetricFamily | CounterMetricFamily | UnknownMetricFamily
    if spec.kind is Kind.COUNTER:
        metric = CounterMetricFamily(spec.name.removesuffix("_total"), spec.help, labels=names)
    elif spec.kind is Kind.UNTYPED:
        metric = UnknownMetricFamily(spec.name, spec.help, labels=names)
    else:
        metric = GaugeMetricFamily(spec.name, spec.help, labels=names)
    for values, value in zip(family.series, family.values, strict=True):
        metric.add_metric([*values, *const], value)
    return metric
