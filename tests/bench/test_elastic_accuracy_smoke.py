"""bench.elastic_accuracy in smoke mode: the quick start's job on a fixed gang and on one resized twice (2, 1, then 2
nodes, each a real torchrun launcher), both to the same last step; the table and the JSON come out."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.smoke import run_smoke, table_header


@pytest.mark.slow
def test_elastic_accuracy_smoke(tmp_path: Path) -> None:
    run = run_smoke("bench.elastic_accuracy", tmp_path / "elastic.json", timeout=600)

    assert table_header(run.stdout) == ["gang", "steps", "validation accuracy", "validation loss", "sizes"]
    fixed, resized = run.results["fixed"], run.results["resized"]
    assert fixed["step"] == resized["step"] > 0
    assert [size.split(" to ")[0] for size in resized["sizes"]] == ["2 nodes", "1 node", "2 nodes"]
    assert 0 <= fixed["acc"] <= 1 and 0 <= resized["acc"] <= 1
    assert "accuracy points" in run.stdout
