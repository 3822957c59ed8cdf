"""The progress line and the summary, from the trainer's records and the files a run leaves (no processes)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from dtrain_operator.local.display import Display, ProgressView, format_duration
from dtrain_operator.local.launch_plan import Workdir
from dtrain_operator.local.progress_file import JsonlTail
from dtrain_operator.local.summary import collect_summary
from tests.builders import a_job


def test_progress_view_follows_the_records_and_estimates_the_eta() -> None:
    view = ProgressView(started=0.0)
    assert view.apply({"event": "start", "maxEpochs": 2}, now=1.0, restarts=0) == "start"
    view.apply({"event": "progress", "epoch": 0, "step": 10, "totalSteps": 110, "loss": 2.0}, now=10.0, restarts=0)
    assert view.eta_seconds() is None  # one point is no rate yet
    kind = view.apply(
        {
            "event": "progress",
            "epoch": 0,
            "step": 30,
            "totalSteps": 110,
            "loss": 1.5,
            "imagesPerSecond": 640.0,
            "epochEnd": True,
        },
        now=20.0,
        restarts=0,
    )
    assert kind == "epoch"
    assert view.eta_seconds() == 40.0  # 20 steps per 10 s, 80 to go
    assert view.fields(now=20.0) == {
        "epoch": "1/2", "step": "30/110", "loss": "1.5", "ips": "640", "elapsed": "00:20", "eta": "00:40",
        "metrics": "",
    }
    # Validation metrics join the line once the trainer reports them, and stay until they change.
    view.apply({"event": "progress", "epoch": 1, "step": 31, "metrics": {"val_loss": 0.4123, "val_acc": 0.8}},
               now=21.0, restarts=0)
    assert view.fields(now=21.0)["metrics"] == "  val_loss 0.4123  val_acc 0.8"
    view.apply({"event": "progress", "epoch": 1, "step": 32}, now=22.0, restarts=0)
    assert "val_loss 0.4123" in view.line(now=22.0)
    # A gang restart resumes from an earlier step: the rate starts over rather than going negative.
    view.apply({"event": "resumed", "step": 20, "epoch": 0}, now=40.0, restarts=1)
    view.apply({"event": "progress", "epoch": 0, "step": 21, "totalSteps": 110}, now=41.0, restarts=1)
    assert view.eta_seconds() is None
    view.apply({"event": "progress", "epoch": 0, "step": 31, "totalSteps": 110}, now=46.0, restarts=1)
    assert view.eta_seconds() == 39.5
    assert view.line(now=46.0).endswith("restarts 1")
    # Lightning has moved its epoch counter past the end when it reports the finish.
    assert view.apply({"event": "finished", "epoch": 2, "step": 110, "loss": 0.5}, now=60.0, restarts=1) == "end"
    assert view.fields(now=60.0)["epoch"] == "1/2" and view.step == 110


def test_format_duration() -> None:
    assert [format_duration(s) for s in (None, 5, 65, 3725)] == ["--:--", "00:05", "01:05", "1:02:05"]


def test_jsonl_tail_waits_for_a_line_to_be_complete(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == []
    path.write_text('{"event": "start"}\n{"event": "prog')
    assert tail.read_new() == [{"event": "start"}]
    with path.open("a") as stream:
        stream.write('ress", "step": 1}\nnot json\n')
    assert tail.read_new() == [{"event": "progress", "step": 1}]
    resumed = JsonlTail(path)
    resumed.skip_existing()
    with path.open("a") as stream:
        stream.write('{"event": "resumed"}\n')
    assert resumed.read_new() == [{"event": "resumed"}]


TWO_NODES = a_job("demo").with_nodes(2)
"""Two nodes of one GPU each: the summary says `2 x 1 gpu`."""


def test_summary_gathers_the_run_and_the_table_shows_it(tmp_path: Path) -> None:
    workdir = Workdir(tmp_path)
    for directory in (workdir.checkpoints, workdir.artifacts, workdir.logs):
        directory.mkdir()
    (workdir.checkpoints / "last.ckpt").write_bytes(b"x")
    workdir.onnx.write_bytes(b"onnx")
    workdir.progress.write_text(
        json.dumps({"event": "progress", "epoch": 0, "step": 7, "loss": 0.9, "imagesPerSecond": 100.0}) + "\n"
    )
    workdir.artifacts_json.write_text(
        json.dumps(
            {
                "onnx": {"path": str(workdir.onnx)},
                "parity": {"maxRelativeError": 2.5e-7},
                "metrics": {"step": 8, "loss": 0.5, "imagesPerSecond": 321.0},
            }
        )
    )
    workdir.engine_report.write_text(
        json.dumps(
            {
                "backend": "onnxruntime-cpu",
                "engine": None,
                "notes": ["No TensorRT engine was built: TensorRT is not installed"],
                "latency": [
                    {"batch_size": 1, "median_ms": 0.5, "pytorch": {"median_ms": 2.0}},
                    {"batch_size": 4, "median_ms": 1.0, "pytorch": None},
                ],
            }
        )
    )
    summary = collect_summary(
        TWO_NODES.as_model(), workdir, phase="Succeeded", reason="", message="", restarts=1, wall_seconds=75,
        engine_asked=True, last_hang="Where it hangs: rank 1 (pod two-1, local node 1) gave no stack",
    )
    assert (summary.steps, summary.final_loss, summary.images_per_second) == (8, 0.5, 321.0)
    assert summary.onnx_parity_error == 2.5e-7
    assert summary.checkpoint == str(workdir.checkpoints / "last.ckpt")
    assert [(row.batch, row.speedup) for row in summary.latency] == [(1, 4.0), (4, None)]
    assert summary.engine_note == "No TensorRT engine was built: TensorRT is not installed"

    out = io.StringIO()
    # Wide: the ONNX line holds the test's tmp path, whose length depends on how pytest runs.
    Display(Console(file=out, width=400)).summary(summary)
    text = out.getvalue()
    for expected in (
        "Succeeded",
        "2 x 1 gpu (nodes 0, 1)",
        "321.0 images/s",
        "01:15",
        "max relative error 2.50e-07",
        "none built; onnxruntime-cpu checked and timed model.onnx instead",
        "4.00x",
        "last hang",
        "Where it hangs: rank 1 (pod two-1, local node 1) gave no stack",
    ):
        assert expected in text, expected
    summary.write(workdir.summary)
    assert json.loads(workdir.summary.read_text())["latency"][0]["speedup"] == 4.0


def test_a_failed_run_without_files_still_summarises(tmp_path: Path) -> None:
    workdir = Workdir(tmp_path)
    workdir.checkpoints.mkdir()
    summary = collect_summary(
        TWO_NODES.as_model(), workdir, phase="Failed", reason="BackoffLimitExceeded",
        message="worker 1 exited with code 1", restarts=0, wall_seconds=3, engine_asked=True,
    )
    assert (summary.steps, summary.checkpoint, summary.onnx, summary.latency) == (None, None, None, [])
    out = io.StringIO()
    Display(Console(file=out, width=160)).summary(summary)
    assert "Failed (BackoffLimitExceeded)" in out.getvalue() and "worker 1 exited with code 1" in out.getvalue()
