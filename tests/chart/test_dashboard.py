"""The Grafana dashboard: valid JSON, every query on a metric (and label) the operator really exports,
and the chart's ConfigMap that Grafana's sidecar loads. The operator process's own /metrics is checked
against the same queries in tests/operator/test_job_metrics.py."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dtrain_operator.api import Goodput
from dtrain_operator.controller.metrics import OperatorMetrics
from tests.chart.helm import CHART_DIR, MONITORING_API, helm_template
from tests.chart.value_sets import VALUE_SETS

DASHBOARD_FILE = CHART_DIR / "files" / "dashboards" / "dtrain-operator.json"
METRIC_NAME = re.compile(r"\b(dtrain_[a-zA-Z0-9_]+)\b")
# Label names in `by (...)`/`without (...)`, in selectors `{name=~"..."}`, and in legends `{{name}}`.
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
GRAFANA_LABEL_VALUES = re.compile(r"label_values\((dtrain_[a-zA-Z0-9_]+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_FILE.read_text())


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def exported_series() -> dict[str, set[str]]:
    """Every sample name the operator's registry exposes, with its label names, once each metric has a value."""
    metrics = OperatorMetrics()
    metrics.api_request("create", "pods", 201)
    metrics.api_request("patch", "distributedtrainings/status", 0)
    metrics.reconcile_seconds.observe(0.02)
    metrics.reconcile_errors.inc()
    metrics.gang_restart(1, "WorkerFailed")
    metrics.job_status(
        ("team-a", "quickstart"),
        {"phase": "Running", "restarts": 1, "progress": {
            "epoch": 2, "step": 40, "loss": 0.3, "imagesPerSecond": 250.0, "metrics": {"val_acc": 0.96}}},
    )
    metrics.job_goodput(("team-a", "quickstart"), Goodput(ratio=0.9, seconds={"productive": 90.0, "starting": 10.0}))
    series: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            series.setdefault(sample.name, set()).update(sample.labels)
    return series


def test_the_dashboard_is_valid_grafana_json() -> None:
    board = dashboard()
    assert board["uid"] == "dtrain-operator" and board["title"]
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["datasource", "job_namespace"]
    for panel in panels(board):
        assert {"type", "title", "gridPos"} <= panel.keys()
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_every_query_names_metrics_and_labels_the_operator_exports() -> None:
    series = exported_series()
    checked = 0
    for panel in panels(dashboard()):
        for target in panel.get("targets", []):
            expr, legend = target["expr"], target.get("legendFormat", "")
            names = METRIC_NAME.findall(expr)
            assert names, f"{panel['title']}: {expr} names no dtrain metric"
            for name in names:
                assert name in series, f"{panel['title']}: {name} is not exported (exported: {sorted(series)})"
            labels = set().union(*(series[name] for name in names))
            used = {label.strip() for group in GROUPING.findall(expr) for label in group.split(",") if label.strip()}
            used |= set(MATCHER.findall(expr)) | set(LEGEND.findall(legend))
            assert used <= labels, f"{panel['title']}: labels {sorted(used - labels)} are not on {names}"
            checked += 1
    assert checked >= 10
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            ((metric, label),) = GRAFANA_LABEL_VALUES.findall(variable["query"]["query"])
            assert label in series[metric]


def test_the_dashboard_shows_what_the_issue_asks_for() -> None:
    expressions = " ".join(t["expr"] for p in panels(dashboard()) for t in p.get("targets", []))
    for needed in ("dtrain_jobs", "dtrain_gang_restarts_total", "dtrain_reconcile_duration_seconds_bucket",
                   "dtrain_api_errors_total", "dtrain_api_requests_total", "dtrain_job_images_per_second",
                   "dtrain_job_loss"):
        assert needed in expressions
    assert "by (reason)" in expressions  # restarts with their reasons
    assert "by (phase)" in expressions


def test_job_series_follow_the_status_and_go_with_the_job() -> None:
    metrics = OperatorMetrics()
    key = ("default", "quickstart")
    metrics.job_status(key, {"phase": "Running", "progress": {"step": 10, "loss": 0.5, "metrics": {"val_acc": 0.9}}})
    text = generate_latest(metrics.registry).decode()
    assert 'dtrain_job_loss{job_name="quickstart",job_namespace="default"} 0.5' in text
    assert 'dtrain_job_metric{job_name="quickstart",job_namespace="default",metric="val_acc"} 0.9' in text
    assert 'dtrain_jobs{phase="Running"} 1.0' in text
    assert "dtrain_job_images_per_second{" not in text  # not reported yet: no series rather than a stale one
    metrics.job_status(key, {"phase": "Running", "progress": {"step": 20, "loss": 0.25}})
    text = generate_latest(metrics.registry).decode()
    assert 'dtrain_job_step{job_name="quickstart",job_namespace="default"} 20.0' in text
    assert 'metric="val_acc"' not in text
    metrics.job_status(key, None)
    text = generate_latest(metrics.registry).decode()
    assert 'job_name="quickstart"' not in text
    assert 'dtrain_jobs{phase="Running"} 0.0' in text


def test_the_chart_ships_the_dashboard_for_the_grafana_sidecar() -> None:
    assert not [o for o in helm_template({}) if o["metadata"]["name"].endswith("-dashboard")]  # off by default
    values, api_versions = VALUE_SETS["monitoring"]
    objects = helm_template(values, api_versions=api_versions)
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "dtrain"}
    assert json.loads(config_map["data"]["dtrain-operator.json"]) == dashboard()
    assert [o["kind"] for o in objects if o["kind"] == "ServiceMonitor"] == ["ServiceMonitor"]
    assert MONITORING_API in api_versions
