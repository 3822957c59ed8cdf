"""Progress: throughput, rate limiting, the sinks, and that a failing sink never stops training."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from dtrain_common.errors import ConfigError
from dtrain_operator.api import contract
from dtrain_operator.api.records import Event, status_patch
from dtrain_trainer.progress import ProgressReporter
from dtrain_trainer.progress_callback import ProgressCallback, ThroughputMeter, batch_size_of
from dtrain_trainer.progress_sinks import (
    JsonlSink,
    NullSink,
    StdoutSink,
    human_line,
    sink_from_env,
)

from .conftest import ListSink


@pytest.fixture(autouse=True)
def outside_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even when the tests run in a pod, the sink must find the test's kubeconfig, not the service account."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class BrokenSink:
    def __init__(self) -> None:
        self.calls = 0

    def send(self, record: Mapping[str, Any]) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        raise OSError(28, "No space left on device")


def test_throughput_leaves_out_warm_up_and_time_between_epochs() -> None:
    clock = FakeClock()
    meter = ThroughputMeter(warmup_batches=2, clock=clock)
    meter.epoch_start()
    for _ in range(2):  # warm-up: slow, not counted
        clock.now += 10.0
        meter.batch_done(images=64)
    assert meter.images_per_second() is None
    for _ in range(4):
        clock.now += 0.5
        meter.batch_done(images=64)
    clock.now += 100.0  # validation between epochs
    meter.epoch_start()
    for _ in range(4):
        clock.now += 0.5
        meter.batch_done(images=64)
    assert meter.images_per_second() == pytest.approx(8 * 64 / 4.0)


def test_throughput_has_one_decimal_as_kubectl_shows_it() -> None:
    clock = FakeClock()
    meter = ThroughputMeter(warmup_batches=0, clock=clock)
    meter.epoch_start()
    clock.now += 7.0
    meter.batch_done(images=1000)
    assert meter.images_per_second() == 142.9


def test_progress_is_rate_limited_and_events_are_not() -> None:
    clock = FakeClock()
    sink = ListSink()
    reporter = ProgressReporter(sink, interval_seconds=15.0, clock=clock)
    sent = 0
    for second in range(40):
        clock.now = float(second)
        if reporter.progress_due():
            reporter.progress(step=second)
            sent += 1
        reporter.event(Event.CHECKPOINT, step=second, path="p")
    assert [r["step"] for r in sink.records if r["event"] == Event.PROGRESS] == [0, 15, 30]
    assert sum(r["event"] == Event.CHECKPOINT for r in sink.records) == 40
    assert all(r["time"].endswith("Z") for r in sink.records)


def test_a_failing_sink_warns_once_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    sink = BrokenSink()
    reporter = ProgressReporter(sink, interval_seconds=0.0)
    with caplog.at_level(logging.WARNING, logger="dtrain_trainer"):
        for step in range(5):
            reporter.progress(step=step)
        reporter.close()
    assert sink.calls == 1
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("progress sink BrokenSink failed" in w for w in warnings) == 1
    assert any("No space left on device" in w for w in warnings)


def test_jsonl_sink_appends_one_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    path.write_text('{"event": "start"}\n')  # a previous process's records stay
    reporter = ProgressReporter(JsonlSink(path), interval_seconds=0.0)
    reporter.progress(epoch=0, step=3, totalSteps=10, loss=0.5, imagesPerSecond=None, epochEnd=False)
    reporter.event(Event.CHECKPOINT, step=3, path="/c/step=00000003.ckpt")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["start", "progress", "checkpoint"]
    assert lines[1]["imagesPerSecond"] is None and lines[1]["totalSteps"] == 10


def test_human_lines() -> None:
    assert (
        human_line({"event": "progress", "epoch": 1, "step": 20, "totalSteps": 100, "loss": 0.123456, "imagesPerSecond": 812.26})
        == "epoch 1  step 20/100  loss 0.1235  812.3 img/s"
    )
    assert human_line({"event": "resumed", "path": "/c/last.ckpt", "step": 40}) == "resumed from /c/last.ckpt at step 40"
    assert human_line({"event": "export", "ok": False, "error": "boom"}) == "export failed: boom"


def test_stdout_sink(capsys: pytest.CaptureFixture[str]) -> None:
    StdoutSink().send({"event": "checkpoint", "step": 4, "path": "/c/step=00000004.ckpt"})
    assert capsys.readouterr().out == "dtrain: checkpoint at step 4: /c/step=00000004.ckpt\n"
    StdoutSink().send({"event": "checkpoint", "step": 6, "path": "s3://b/c/step=00000006.ckpt", "ok": False, "error": "E"})
    assert capsys.readouterr().out == "dtrain: checkpoint of step 6 NOT saved to s3://b/c/step=00000006.ckpt: E\n"


def test_status_patch_leaves_out_unknown_values() -> None:
    record = {"event": "progress", "time": "t", "epoch": 0, "step": 3, "loss": None, "imagesPerSecond": None}
    assert status_patch(record) == {"progress": {"epoch": 0, "step": 3, "updatedAt": "t"}}
    assert status_patch({"event": "checkpoint", "time": "t", "step": 4, "path": "p"}) == {
        "lastCheckpoint": {"step": 4, "path": "p", "time": "t", "missed": None}  # null: a miss reported before is over
    }
    assert status_patch({"event": "start"}) is None


def test_batch_size_of() -> None:
    import torch

    assert batch_size_of((torch.zeros(5, 3), torch.zeros(5))) == 5
    assert batch_size_of({"image": torch.zeros(7, 3)}) == 7
    assert batch_size_of("text") is None


def test_sink_choice(tmp_path: Path) -> None:
    assert isinstance(sink_from_env({}, "j"), StdoutSink)
    assert isinstance(sink_from_env({contract.ENV_PROGRESS_SINK: "none"}, "j"), NullSink)
    jsonl = sink_from_env({contract.ENV_PROGRESS_SINK: f"jsonl:{tmp_path}/p.jsonl"}, "j")
    assert isinstance(jsonl, JsonlSink) and jsonl.path == tmp_path / "p.jsonl"
    with pytest.raises(ConfigError, match="give a file"):
        sink_from_env({contract.ENV_PROGRESS_SINK: "jsonl:"}, "j")


def test_a_report_after_the_fit_loop_names_the_last_epoch_trained() -> None:
    """Once the fit loop ends, Lightning's current_epoch is one past the last epoch: the report of the final
    checkpoint (written at on_train_end) says the epoch of the last batch, so no display shows epoch 7 of 6."""
    sink = ListSink()
    callback = ProgressCallback(ProgressReporter(sink, interval_seconds=0.0), default_batch_size=8)
    trainer = SimpleNamespace(
        is_global_zero=True, current_epoch=5, global_step=131, world_size=2, accumulate_grad_batches=1,
        progress_bar_metrics={}, callback_metrics={}, estimated_stepping_batches=132,
    )
    callback.on_train_start(trainer, None)
    trainer.global_step = 132
    callback.on_train_batch_end(trainer, None, torch.tensor(0.5), (torch.zeros(8, 3), torch.zeros(8)), 21)
    trainer.current_epoch = 6  # the loop is over
    callback.checkpoint_writing(True)
    callback.checkpoint_writing(False)
    reported = [r for r in sink.records if r["event"] == Event.PROGRESS]
    assert [r["stage"] for r in reported[-2:]] == [contract.PROGRESS_STAGE_CHECKPOINTING, contract.PROGRESS_STAGE_TRAINING]
    assert {r["epoch"] for r in reported} == {5}
    assert callback.final_metrics(trainer)["epoch"] == 5
