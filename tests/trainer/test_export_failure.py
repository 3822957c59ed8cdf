"""A model that trains but cannot be exported: the training succeeds, the results say why there is no model.onnx."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dtrain_operator.api import contract

from .conftest import read_jsonl, run_trainer, trainer_config, write_config

pytestmark = pytest.mark.slow


def test_an_export_failure_after_training_exits_0_with_the_exporters_message(tmp_path: Path) -> None:
    config = trainer_config(tmp_path, model={"classPath": "dtrain_test_user.UnexportableClassifier", "initArgs": {}})
    progress, termination_log = tmp_path / "progress.jsonl", tmp_path / "termination-log"
    run = run_trainer(
        write_config(tmp_path, config),
        DTRAIN_PROGRESS_SINK=f"jsonl:{progress}",
        DTRAIN_TERMINATION_LOG=str(termination_log),
    )
    # Exit 0: a restart would train again only to fail the same way.
    assert run.returncode == 0, run.stderr
    results = json.loads(termination_log.read_text())
    error = results[contract.RESULTS_KEY_EXPORT_ERROR]
    assert results["ok"] is True and results["step"] == 4
    assert "ONNX Runtime disagrees with PyTorch" in error
    events = read_jsonl(progress)
    assert [e["event"] for e in events][-2:] == ["export", "finished"]
    assert events[-2]["ok"] is False and events[-1]["exportError"] == error
    # The checkpoints stay; no model.onnx is left half-made.
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "artifacts" / contract.ONNX_FILE_NAME).exists()
