"""bench.checkpoint_cost in smoke mode: one checkpoint saved to a local disk and uploaded to the real S3 server
through the trainer's own writers; the table, the figure per 100 MB and the JSON come out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import run_smoke, table_header


@pytest.mark.slow
def test_checkpoint_cost_smoke(tmp_path: Path) -> None:
    run = run_smoke("bench.checkpoint_cost", tmp_path / "checkpoint_cost.json", timeout=600)

    assert table_header(run.stdout) == ["target", "size MB", "median s", "s per 100 MB", "MB/s", "peak added MB"]
    assert "checkpoint upload time per 100 MB: " in run.stdout
    rows = {row["target"].split()[0]: row for row in run.results["rows"]}
    assert set(rows) == {"local", "s3"}
    assert run.results["upload_seconds_per_100mb"] == rows["s3"]["seconds_per_100mb"] > 0
    # Streamed: the upload adds the largest tensor and a few 16 MiB parts, never a second copy of the checkpoint.
    assert rows["s3"]["size_mb"] == 256 and rows["s3"]["peak_added_mb"] < 256
