"""Validation and user metrics reach the progress records, the status patch and the log lines; the logger is
the spec's (TensorBoard by default, CSV, MLflow), one continuous log across a gang restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dtrain_operator.api.records import status_patch
from dtrain_operator.local.display import ProgressView, summary_table
from dtrain_operator.local.summary import RunSummary
from dtrain_trainer.progress_sinks import human_line

from .conftest import read_jsonl, run_trainer, trainer_config, write_config
from .user_code.dtrain_test_user import CRASH_EXIT_CODE

pytestmark = pytest.mark.slow

MODEL = "dtrain_test_user.ValidatedClassifier"
DATA = "dtrain_test_user.RandomImageDataWithValidation"


def config_for(tmp_path: Path, logging: dict[str, Any], **model_args: Any) -> dict[str, Any]:
    # 64 samples in batches of 8: 8 steps an epoch, validated at the end of each; 16 steps are two.
    return trainer_config(
        tmp_path,
        model={"classPath": MODEL, "initArgs": model_args},
        data={"classPath": DATA},
        trainer={"maxSteps": 16, "maxEpochs": 3},
        checkpoint={"everyNSteps": 3, "keepLast": 1},
        export={"onnx": {"enabled": False}},
        logging=logging,
    )


def crash_then_resume(tmp_path: Path, logging: dict[str, Any], **env: str) -> list[dict[str, Any]]:
    """A run that dies after step 9 (past the first validation) and its restart; the progress records of both."""
    progress = tmp_path / "progress.jsonl"
    path = write_config(
        tmp_path, config_for(tmp_path, logging, crash_at_step=9, crash_marker=str(tmp_path / "crashed"))
    )
    first = run_trainer(path, DTRAIN_PROGRESS_SINK=f"jsonl:{progress}", **env)
    assert first.returncode == CRASH_EXIT_CODE, first.stderr[-2000:]
    second = run_trainer(path, DTRAIN_PROGRESS_SINK=f"jsonl:{progress}", **env)
    assert second.returncode == 0, second.stderr[-2000:]
    return read_jsonl(progress)


def test_metrics_reach_records_status_and_lines_and_tensorboard_keeps_one_log(tmp_path: Path) -> None:
    records = crash_then_resume(tmp_path, {"metrics": ["weight_norm"]})
    validated = [r for r in records if r["event"] == "progress" and "val_loss" in (r.get("metrics") or {})]
    assert validated, "no progress record carries val_loss"
    last = validated[-1]
    assert set(last["metrics"]) == {"val_loss", "val_acc", "train_acc", "weight_norm"}
    assert last["validation"] == f"val_loss={last['metrics']['val_loss']:.4g}"
    finished = records[-1]
    assert finished["event"] == "finished" and set(finished["metrics"]) >= {"val_loss", "val_acc"}

    patch = status_patch(last)
    assert patch is not None and patch["progress"]["metrics"] == last["metrics"]
    assert patch["progress"]["validation"] == last["validation"]
    assert "val_loss" in human_line(last) and "val_acc" in human_line(last)
    view = ProgressView(started=0.0)
    for record in records:
        view.apply(record, now=1.0, restarts=0)
    assert "val_loss" in view.line(1.0)
    summary = RunSummary("job", "Succeeded", "", "", 1, 1, "cpu", 1, 1.0, str(tmp_path), metrics=view.metrics)
    assert "val_acc" in str(summary_table(summary).columns[0]._cells)

    # TensorBoard is the default logger, and the restart wrote into the same run directory.
    logs = tmp_path / "artifacts" / "logs"
    assert [p.name for p in logs.iterdir()] == ["version_0"]
    assert len(list((logs / "version_0").glob("events.out.tfevents.*"))) == 2  # one file per start, one run


def test_csv_logger_appends_across_a_restart(tmp_path: Path) -> None:
    crash_then_resume(tmp_path, {"logger": "csv"})
    logs = tmp_path / "artifacts" / "logs"
    assert [p.name for p in logs.iterdir()] == ["version_0"]
    lines = (logs / "version_0" / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    steps = [int(row.split(",")[header.index("step")]) for row in lines[1:] if row.split(",")[header.index("step")]]
    assert min(steps) < 9 <= max(steps)  # rows from before the crash and after the resume, in one file


def test_mlflow_logger_keeps_one_run_across_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    # A local file store stands in for the tracking server (MLflow 3 asks for consent to use one).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    uri = f"file://{tmp_path / 'mlruns'}"
    crash_then_resume(tmp_path, {"logger": "mlflow", "mlflowExperimentName": "resnet-runs"}, MLFLOW_TRACKING_URI=uri)
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("resnet-runs")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_name == "test-job"
    history = client.get_metric_history(runs[0].info.run_id, "val_loss")
    assert len(history) >= 2  # validated before the crash and after the resume, into the same run
