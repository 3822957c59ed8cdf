"""bench.data_pipeline in smoke mode: both pipelines read the JPEGs, the model steps, the table and the JSON come out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import run_smoke, table_header


@pytest.mark.slow
def test_data_pipeline_smoke(tmp_path: Path) -> None:
    run = run_smoke("bench.data_pipeline", tmp_path / "data_pipeline.json")
    assert table_header(run.stdout) == ["pipeline (one loader worker)", "images/s per worker", "workers to feed the model"]
    results = run.results
    assert results["benchmark"] == "data_pipeline"
    assert results["model_images_per_second"] > 0
    for side in ("dtrain", "classic"):
        pipeline = results["pipelines"][side]
        assert pipeline["images_per_second_per_worker"] > 0 and pipeline["workers_needed"] >= 1
    assert results["speedup_dtrain_over_classic"] > 0
