"""bench.trainer_overhead in smoke mode: both sides train under torchrun, the table and the JSON come out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import run_smoke, table_header


@pytest.mark.slow
def test_trainer_overhead_smoke(tmp_path: Path) -> None:
    run = run_smoke("bench.trainer_overhead", tmp_path / "trainer_overhead.json", "--workdir", str(tmp_path / "runs"))

    assert table_header(run.stdout) == [
        "measure", "raw PyTorch DDP", "dtrain", "dtrain / raw (median, min-max)", "target"
    ]
    results = run.results
    assert results["benchmark"] == "trainer_overhead"
    assert {"machine", "workload", "summary", "runs"} <= results.keys()
    summary = results["summary"]
    for side in ("raw", "dtrain"):
        assert {"images_per_second", "wall_seconds", "peak_rss_mib_max_rank"} <= summary[side].keys()
    assert {"median", "min", "max"} <= summary["ratio_dtrain_over_raw"].keys()
    assert isinstance(summary["meets_target"], bool)
    assert [(r["arm"], r["repetition"]) for r in results["runs"]] == [("raw", 1), ("dtrain", 1)]
    for side_run in results["runs"]:
        assert side_run["images_per_second"] > 0 and side_run["wall_seconds"] > 0
        # One peak per rank of the 2-process torchrun.
        assert sorted(side_run["peak_rss_mib_per_rank"]) == ["rank 0", "rank 1"]
    # Both sides really trained the configured steps and wrote their final checkpoint.
    assert (tmp_path / "runs" / "raw-1" / "checkpoints" / "last.ckpt").is_file()
    assert (tmp_path / "runs" / "dtrain-1" / "checkpoints" / "last.ckpt").is_file()
