"""The Grafana dashboard queries only metrics the aggregator exposes, in valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from hami_metrics import families
from hami_metrics.families import FamilySpec, Kind

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "dashboards" / "hami.json"
METRIC = re.compile(r"\b(hami_[a-z_]+)\b")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]


def exposed() -> set[str]:
    names = set()
    for value in vars(families).values():
        if isinstance(value, FamilySpec):
            names.add(value.name)
            if value.kind is Kind.HISTOGRAM:
                names.update(value.name + suffix for suffix in HISTOGRAM_SUFFIXES)
    return names


def test_every_metric_the_dashboard_queries_is_exposed() -> None:
    queried = {name for expr in exprs() for name in METRIC.findall(expr)}
    assert queried
    assert queried - exposed() == set()


def test_every_dashboard_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$node", ".*").replace("$namespace", ".*")}
        for i, expr in enumerate(exprs())
    ]
    path = tmp_path / "rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
