"""bench.operator_scale in smoke mode: the operator process creates the jobs' children over HTTP and is counted,
against the operator tests' API emulator and against kube-apiserver and etcd (make test builds them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import run_smoke, table_header


@pytest.mark.slow
@pytest.mark.parametrize("apiserver", ["emulator", "real"])
def test_operator_scale_smoke(tmp_path: Path, apiserver: str) -> None:
    run = run_smoke(
        "bench.operator_scale", tmp_path / "operator_scale.json", "--apiserver", apiserver,
        "--workdir", str(tmp_path / "run"),
    )

    assert table_header(run.stdout) == ["measure", "value", "target"]
    results = run.results
    assert results["benchmark"] == "operator_scale"
    assert results["apiserver"]["kind"] == apiserver
    assert results["scenario"]["jobs"] == 4 and results["scenario"]["nodes"] == 2
    for key in ("create_to_pods_seconds", "pods_running_to_job_running_seconds"):
        assert {"p50", "p99", "max"} <= results[key].keys()
    assert {
        "all_jobs_have_pods_after_seconds", "requests_per_job", "minimum_requests_per_job", "request_ratio",
        "status_patches_per_job", "requests_per_job_by_kind", "operator_cpu_seconds", "operator_peak_rss_mib",
    } <= results.keys()
    # The API server counted the operator creating every job's Service and 2 pods; so did the operator.
    for by_kind in (results["requests_per_job_by_kind"], results["operator_metrics_requests_per_job_by_kind"]):
        assert by_kind["create services"] >= 1 and by_kind["create pods"] >= 2 and "create configmaps" not in by_kind
    # A Service, 2 pods and 2 status patches (the status is the operator's record).
    assert results["minimum_requests_per_job"] == 1 + 2 + 2
    assert results["operator_peak_rss_mib"] > 0
    # What the work queue is measured by: reconciles against the watch events that caused them.
    assert results["reconciles_per_job"] > 0 and results["job_watch_events_per_job"] > 0
