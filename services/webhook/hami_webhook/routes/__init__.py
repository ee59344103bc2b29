"""The webhook's HTTP routes: ``POST /webhook`` and the health probes."""
