"""The Grafana dashboard ships as a ConfigMap that Grafana's dashboard sidecar picks up, generated from the one
JSON file (deploy/dashboards/hami.json) so it is written once."""

from __future__ import annotations

import json
from typing import Final

from tests.deploy.manifests import DEPLOY, NAMESPACE, Rendering

DASHBOARD: Final = DEPLOY / "dashboards" / "hami.json"
NAME: Final = "hami-grafana-dashboard"


def test_every_overlay_ships_the_dashboard_as_a_configmap_the_grafana_sidecar_loads(overlay: Rendering) -> None:
    (configmap,) = [o for o in overlay.of_kind("ConfigMap") if o["metadata"]["name"] == NAME]  # no hash suffix
    assert configmap["metadata"]["namespace"] == NAMESPACE
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert list(configmap["data"]) == ["hami.json"]


def test_the_dashboard_in_the_configmap_parses_and_is_the_file_as_written(overlay: Rendering) -> None:
    shipped = json.loads(overlay.get("ConfigMap", NAME)["data"]["hami.json"])
    assert shipped == json.loads(DASHBOARD.read_text())
    assert shipped["uid"]
    assert shipped["panels"]
