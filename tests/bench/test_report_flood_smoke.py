"""bench.report_flood in smoke mode: both endpoints flooded, the table and the JSON come out; the bounded one holds
no more than its per-pod share of connections and answers the honest report."""

from __future__ import annotations

from pathlib import Path

from dtrain_operator.controller.report_limits import MAX_CONNECTIONS_PER_PEER
from tests.bench.smoke import run_smoke, table_header


def test_report_flood_smoke(tmp_path: Path) -> None:
    run = run_smoke("bench.report_flood", tmp_path / "report_flood.json")
    assert table_header(run.stdout)[0] == "endpoint"
    unbounded, bounded = run.results["cases"]
    assert (unbounded["bounded"], bounded["bounded"]) == (False, True)
    assert bounded["held"] <= MAX_CONNECTIONS_PER_PEER * bounded["pods"] < unbounded["held"]
    assert bounded["honest_status"] == 204
