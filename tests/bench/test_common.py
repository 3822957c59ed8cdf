"""The arithmetic every benchmark's numbers pass through."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.common import json_safe, markdown_table, percentile, spread, write_results
from bench.step_clock import median_batch_images_per_second, steady_images_per_second


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([5.0], 99, 5.0), ([1.0, 2.0, 3.0, 4.0], 50, 2.5), ([1.0, 2.0, 3.0, 4.0], 100, 4.0), (list(range(101)), 99, 99.0)],
)
def test_percentile(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_spread_reports_half_range_relative_to_median() -> None:
    assert spread([0.9, 1.0, 1.1]) == pytest.approx({"median": 1.0, "min": 0.9, "max": 1.1, "half_range_pct": 10.0})


def test_steady_rate_leaves_out_warmup_batches() -> None:
    # Two slow warm-up batches, then one batch every 0.5 s.
    times = [3.0, 5.0, 5.5, 6.0, 6.5, 7.0]
    assert steady_images_per_second(times, warmup_batches=2, images_per_batch=8) == pytest.approx(16.0)


def test_steady_rate_needs_timed_batches() -> None:
    with pytest.raises(ValueError, match="warm-up"):
        steady_images_per_second([1.0, 2.0], warmup_batches=2, images_per_batch=8)


def test_markdown_table_formats_numbers() -> None:
    table = markdown_table(["a", "b"], [[1234.5, 0.012345], ["x", float("nan")]])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1,234 | 0.0123 |", "| x | n/a |"]


def test_results_are_strict_json(tmp_path: Path) -> None:
    path = write_results("unit", {"rate": float("nan"), "rows": [{"p99": math.inf, "ok": 1.5}]}, tmp_path / "r.json")
    document = json.loads(path.read_text())
    assert document["rate"] is None and document["rows"] == [{"p99": None, "ok": 1.5}]
    assert document["benchmark"] == "unit" and "finished_at" in document
    assert json_safe((1.0, [math.nan])) == [1.0, [None]]


def test_median_batch_rate_ignores_one_slow_batch() -> None:
    # Warm-up batch, then batches of 0.5 s with one 3 s stall.
    times = [2.0, 2.5, 3.0, 6.0, 6.5, 7.0]
    assert median_batch_images_per_second(times, warmup_batches=1, images_per_batch=8) == pytest.approx(16.0)
