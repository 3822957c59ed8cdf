"""bench.validate_scale in smoke mode: each shape at each size is validated, the table and the JSON come out."""

from __future__ import annotations

from pathlib import Path

from tests.bench.smoke import run_smoke, table_header


def test_validate_scale_smoke(tmp_path: Path) -> None:
    run = run_smoke("bench.validate_scale", tmp_path / "validate_scale.json", "--repetitions", "1")
    assert table_header(run.stdout)[:2] == ["input", "entries"]
    cases = run.results["cases"]
    assert {(case["shape"], case["entries"]) for case in cases} == {
        (shape, size) for shape in ("unknown keys under spec", "env entries") for size in (100, 1000)
    }
    assert all(case["cpu_seconds"] > 0 for case in cases)
