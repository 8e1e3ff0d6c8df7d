"""The Grafana dashboard in the chart queries only metrics the code exports, and every one of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from corral.obs import metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "corral" / "dashboards" / "corral.json"


def exported() -> set[str]:
    names = set()
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                names.add(family.name + ("_total" if family.type == "counter" else ""))
    return names


def test_every_query_names_an_exported_metric_and_every_metric_is_shown() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|count|sum)$", "", name) for e in exprs for name in re.findall(r"corral_\w+", e)}
    assert used <= exported(), f"queries of metrics that do not exist: {used - exported()}"
    assert exported() <= used, f"metrics with no panel: {exported() - used}"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
