"""The records between processes: writers are held to the model, readers take what they can."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from dtrain_operator.api import records
from dtrain_operator.api.engine_report import EngineReport
from dtrain_operator.api.results import EngineResults, TrainerResults, read_termination_message


def test_a_writer_cannot_send_a_field_the_record_does_not_have_nor_a_wrong_type() -> None:
    with pytest.raises(ValidationError, match="stpe"):
        records.build_record(records.Event.CHECKPOINT, step=3, stpe=4)
    with pytest.raises(ValidationError, match="step"):
        records.build_record(records.Event.PROGRESS, step="3")
    with pytest.raises(ValidationError, match="exportEror"):
        TrainerResults(ok=True, exportEror="boom")


def test_the_wire_form_holds_what_the_writer_set_and_nothing_else() -> None:
    record = records.build_record(records.Event.PROGRESS, time="t", step=3, totalSteps=None, imagesPerSecond=12.5)
    assert record.to_wire() == {"event": "progress", "time": "t", "step": 3, "totalSteps": None, "imagesPerSecond": 12.5}


def test_a_reader_ignores_unknown_fields_and_reads_a_wrong_type_as_absent() -> None:
    record = records.read_record({"event": "progress", "step": True, "loss": 0.5, "fromTheFuture": 1,
                                  "metrics": {"val_acc": 0.9, "note": "x"}})
    assert isinstance(record, records.ProgressRecord)
    assert (record.step, record.loss, record.metrics) == (None, 0.5, {"val_acc": 0.9})
    assert records.read_record({"event": "teleported"}) is None
    assert records.read_record(["progress"]) is None


def test_the_engine_report_is_read_with_unknown_parts_left_out() -> None:
    report = EngineReport.read({"schema": "dtrain.dev/engine-report/v2", "backend": "tensorrt", "v3": {},
                                "latency": [{"batch_size": 1, "median_ms": 0.5, "pytorch": {"median_ms": 2.0, "new": 1}}]})
    assert report is not None and report.report_schema == "dtrain.dev/engine-report/v2"
    assert report.latency is not None and report.latency[0].pytorch is not None
    assert report.latency[0].pytorch.median_ms == 2.0


def test_the_engine_results_are_told_from_the_trainers_in_the_merged_artifacts() -> None:
    artifacts = read_termination_message('{"ok": true, "step": 8, "onnx": "/a/model.onnx"}')
    assert artifacts is not None
    assert EngineResults.read(artifacts) is None
    trainer = TrainerResults.read(artifacts)
    assert trainer is not None and (trainer.step, trainer.onnx) == (8, "/a/model.onnx")
    merged = {**artifacts, "kind": "engine", "backend": "tensorrt", "latency": [[1, 0.5, 0.6, 2000.0, None]]}
    engine = EngineResults.read(merged)
    assert engine is not None and engine.latency == [[1, 0.5, 0.6, 2000.0, None]]
    assert read_termination_message("exit 1") is None
