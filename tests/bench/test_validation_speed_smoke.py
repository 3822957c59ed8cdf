"""bench.validation_speed in smoke mode: every spec is validated with the verdict its name says, each message
short, and the table and the JSON come out."""

from __future__ import annotations

from pathlib import Path

from bench.validation_speed import SPECS
from tests.bench.smoke import run_smoke, table_header
from tests.corpus import MAX_MESSAGE_BYTES


def test_validation_speed_smoke(tmp_path: Path) -> None:
    run = run_smoke("bench.validation_speed", tmp_path / "validation_speed.json", "--repetitions", "1")
    assert table_header(run.stdout)[:3] == ["spec", "bytes", "verdict"]
    cases = run.results["cases"]
    assert [case["spec"] for case in cases] == list(SPECS)
    for case in cases:
        at_most_a_cap = case["spec"] == "the quick start" or "(the cap" in case["spec"]
        assert case["verdict"] == ("accepted" if at_most_a_cap else "refused"), case
        assert case["message_bytes"] < MAX_MESSAGE_BYTES and case["validate_ms"] > 0
    assert run.results["layout"]["ms"] > 0
