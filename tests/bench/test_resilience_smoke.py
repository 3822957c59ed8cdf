"""bench.resilience in smoke mode: a hung gang restarted by its progress deadline, the pre-flight of every
gang start, and a straggler named, each through a real `dtrain run`; the table and the JSON come out."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtrain_operator.api import contract
from tests.bench.smoke import run_smoke, table_header


@pytest.mark.slow
def test_resilience_smoke(tmp_path: Path) -> None:
    run = run_smoke("bench.resilience", tmp_path / "resilience.json", timeout=600)

    assert table_header(run.stdout) == ["measure", "dtrain", "without it"]
    results = run.results
    assert {"machine", "hang", "preflight", "straggler"} <= results.keys()
    hang = results["hang"]
    assert hang["progress_deadline_seconds"] == contract.MIN_PROGRESS_DEADLINE_SECONDS
    # The hung gang was restarted, then trained again, in that order.
    assert 0 < hang["restart_decided_seconds"] <= hang["gang_restarted_seconds"] <= hang["training_again_seconds"]
    # One pre-flight per gang start: the hang job's two gangs and the straggler job's one.
    assert results["preflight"]["starts"] == 3
    straggler = results["straggler"]
    assert straggler["detected_at_step"] > 0 and straggler["ratio"] >= 1.5
