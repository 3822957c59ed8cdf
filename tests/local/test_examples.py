"""The examples train as their comments say."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .dtrain_process import DtrainRun, records

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_articles_lit_model_trains_with_dtrain_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As its comment says: PYTHONPATH=examples dtrain run examples/lit-model.yaml
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXAMPLES), os.environ.get("PYTHONPATH")])))
    workdir = tmp_path / "work"
    run = DtrainRun(tmp_path, str(EXAMPLES / "lit-model.yaml"), "--workdir", str(workdir), "--no-engine")
    code = run.wait(240)
    assert code == 0, run.output
    # Two nodes on one machine share its disk; on a cluster the same file needs spec.storage (docs/storage.md).
    assert "runs here; a cluster would refuse it: the job has no shared storage" in run.output
    assert run.leftovers() == []
    summary = json.loads((workdir / "summary.json").read_text())
    assert (summary["phase"], summary["steps"]) == ("Succeeded", 8), run.output  # 256 samples / (16 x 2 ranks)
    start = next(r for r in records(workdir) if r.get("event") == "start")
    assert start["lightning"] == "pytorch_lightning"
    assert summary["onnx"] and Path(summary["onnx"]).is_file()
