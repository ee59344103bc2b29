"""HAMi metrics aggregator: the cluster's GPU state from the bus, served as Prometheus metrics on :31993.

* :mod:`~hami_metrics.state` — the pure fold: ``apply(state, event, now_ns)``; :mod:`~hami_metrics.staleness`
  (``expire``), :mod:`~hami_metrics.podusage` (HAMi's per-GPU collapsing), :mod:`~hami_metrics.nodemap`.
* What it reads is :mod:`hami_common.events`: on ``hami.usage.<node>`` the ``UsageMessage`` union
  (``UsageSample``, ``DeviceSample``, ``PodEnded``, ``NodePods``), and the optional timings of
  ``PlacementDecision`` and ``AllocationResult``.
* :mod:`~hami_metrics.families` — every family's name, type, help and labels (HAMi's, legacy, ours);
  :mod:`~hami_metrics.exposition` — ``collect(state, scrape)``; :mod:`~hami_metrics.textformat` — the text
  format; :mod:`~hami_metrics.collector` — the same through prometheus_client.
* :mod:`~hami_metrics.aggregator` — holds the state, bus adapters, node-hash shards;
  :mod:`~hami_metrics.app` — ``create_app(settings=None)`` with ``/metrics`` and ``/healthz``;
  :mod:`~hami_metrics.main` — the ``hami-metrics`` console script.
"""
