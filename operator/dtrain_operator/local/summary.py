"""The closing summary of `dtrain run`, gathered from what the run left in its workdir.

The trainer's progress records, its artifacts.json and the engine report are the
sources; the summary is printed as a table and written as summary.json.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from dtrain_operator.api import DistributedTraining, records
from dtrain_operator.api.engine_report import EngineReport
from dtrain_operator.core import goodput
from dtrain_operator.local.launch_plan import Workdir
from dtrain_operator.local.progress_file import JsonlTail


@dataclass(frozen=True)
class LatencyRow:
    """Inference latency at one batch size, and how it compares with PyTorch eager."""

    batch: int
    latency_ms: float | None
    eager_ms: float | None

    @property
    def speedup(self) -> float | None:
        if self.latency_ms and self.eager_ms:
            return self.eager_ms / self.latency_ms
        return None


@dataclass
class RunSummary:
    job_name: str
    phase: str
    reason: str
    message: str
    nodes: int
    devices_per_node: int
    accelerator: str
    restarts: int
    wall_seconds: float
    workdir: str
    # Restarts a RestartGangIgnoringBackoff failure rule decided (not counted in restarts).
    restarts_ignoring_backoff: int = 0
    steps: int | None = None
    # Per restart: the steps the gang before it had reached that the new gang trained again (see steps_lost).
    steps_lost: list[int] = field(default_factory=list)
    epoch: int | None = None
    final_loss: float | None = None
    images_per_second: float | None = None
    # The trainer's reported metrics at the end (val_loss, val_acc, prog_bar ones, spec.logging.metrics).
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None
    onnx: str | None = None
    onnx_parity_error: float | None = None
    engine_asked: bool = False
    engine_backend: str | None = None
    engine_path: str | None = None
    # Why no engine was built, when none was (the engine report's first note).
    engine_note: str | None = None
    engine_report: str | None = None
    latency: list[LatencyRow] = field(default_factory=list)
    # Where both were timed on the CPU: the threads each computed on (the engine report's timing.cpu_threads).
    latency_threads: int | None = None
    # The latest gang's pre-flight check (the trainer's preflight record, as in status.preflight).
    preflight: dict[str, Any] | None = None
    # The slowest rank as rank 0 last reported it (status.progress.stragglers).
    stragglers: dict[str, Any] | None = None
    # Where the ranks' step time went, and the bottleneck, as rank 0 last reported it (status.progress.stepBreakdown).
    step_breakdown: dict[str, Any] | None = None
    # Where the latest hang sat, as the progress deadline named it (status.lastHang.message).
    last_hang: str | None = None
    # Where the run's wall time went, {ratio, seconds: {category: s}} (core/goodput.py).
    goodput: dict[str, Any] | None = None
    # What the table's title names: `dtrain run` here, `dtrain watch` for a job on a cluster.
    command: str = "dtrain run"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["latency"] = [{**asdict(row), "speedup": row.speedup} for row in self.latency]
        return data

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest checkpoint file: what a restart or `--resume` continues from."""
    checkpoints = [p for p in directory.glob("**/*.ckpt") if p.is_file()]
    return max(checkpoints, key=lambda p: p.stat().st_mtime) if checkpoints else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def collect_summary(
    job: DistributedTraining,
    workdir: Workdir,
    *,
    phase: str,
    reason: str,
    message: str,
    restarts: int,
    wall_seconds: float,
    engine_asked: bool,
    restarts_ignoring_backoff: int = 0,
    last_hang: str | None = None,
) -> RunSummary:
    spec = job.spec
    summary = RunSummary(
        job_name=job.name,
        phase=phase,
        reason=reason,
        message=message,
        nodes=spec.nodes,
        devices_per_node=spec.devices_per_node,
        accelerator=spec.accelerator,
        restarts=restarts,
        restarts_ignoring_backoff=restarts_ignoring_backoff,
        wall_seconds=wall_seconds,
        workdir=str(workdir.root),
        engine_asked=engine_asked,
        last_hang=last_hang,
    )
    progress = JsonlTail(workdir.progress).read_new()
    _add_progress(summary, progress)
    summary.steps_lost = steps_lost(progress)
    ended = datetime.now(timezone.utc)
    summary.goodput = goodput.from_records(progress, ended - timedelta(seconds=wall_seconds), ended, engine_asked)
    checkpoint = latest_checkpoint(workdir.checkpoints)
    # On object storage the workdir holds none: the newest one the trainer reports saved (a URL).
    saved = [r.path for r in map(records.read_record, progress) if isinstance(r, records.CheckpointRecord) and r.ok]
    summary.checkpoint = str(checkpoint) if checkpoint else (saved[-1] if saved else None)
    _add_artifacts(summary, workdir)
    _add_engine_report(summary, workdir)
    return summary


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _add_progress(summary: RunSummary, raw_records: list[dict[str, Any]]) -> None:
    """Steps, loss and throughput from the trainer's last progress or finished record; ONNX from its export record."""
    for record in map(records.read_record, raw_records):
        if isinstance(record, (records.ProgressRecord, records.FinishedRecord)):
            summary.steps = record.step if record.step is not None else summary.steps
            summary.epoch = record.epoch if record.epoch is not None else summary.epoch
            summary.final_loss = record.loss if record.loss is not None else summary.final_loss
            summary.images_per_second = (
                record.images_per_second if record.images_per_second is not None else summary.images_per_second
            )
            if isinstance(record, records.ProgressRecord) and record.step_times is not None:
                summary.stragglers = record.step_times.model_dump(by_alias=True, exclude_unset=True, mode="json")
            if isinstance(record, records.ProgressRecord) and record.step_breakdown is not None:
                summary.step_breakdown = record.step_breakdown.model_dump(by_alias=True, exclude_unset=True, mode="json")
            summary.metrics.update(record.metrics or {})
        elif isinstance(record, records.PreflightRecord):
            summary.preflight = {k: v for k, v in record.to_wire().items() if k != "event"}
        elif isinstance(record, records.ExportRecord) and record.ok:
            summary.onnx = record.onnx or summary.onnx
            summary.onnx_parity_error = record.parity_error


def steps_lost(raw_records: list[dict[str, Any]]) -> list[int]:
    """For every gang that followed another, the steps the one before had reached and this one trained again.

    Reached: the highest step of the earlier gang's progress and checkpoint records (a survivor's checkpoint
    record included, dtrain_trainer.survivor); rank 0 reports progress every few seconds, so when rank 0 was
    the one lost this is a lower bound. Again: from the step the new gang resumed from, or from 0 when it
    started without a checkpoint.
    """
    lost: list[int] = []
    reached: int | None = None
    pending: int | None = None  # what the gang before the latest start had reached
    for record in map(records.read_record, raw_records):
        if isinstance(record, records.StartRecord):
            if reached is not None:
                pending, reached = reached, None
        elif isinstance(record, records.ResumedRecord) and pending is not None:
            lost.append(max(0, pending - (record.step or 0)))
            pending, reached = None, record.step
        elif isinstance(record, (records.ProgressRecord, records.CheckpointRecord, records.FinishedRecord,
                                 records.StoppedRecord)) and record.step is not None:
            if pending is not None:  # trained on without resuming: from scratch
                lost.append(pending)
                pending = None
            if not isinstance(record, records.CheckpointRecord) or record.ok:
                reached = max(reached or 0, record.step)
    return lost


def _add_artifacts(summary: RunSummary, workdir: Workdir) -> None:
    """model.onnx, its parity error and the final metrics from the trainer's artifacts.json."""
    artifacts = _read_json(workdir.artifacts_json)
    if artifacts is None:
        summary.onnx = str(workdir.onnx) if workdir.onnx.is_file() else None
        return
    onnx = artifacts.get("onnx") or {}
    summary.onnx = onnx.get("path") or (str(workdir.onnx) if workdir.onnx.is_file() else None)
    parity = _number((artifacts.get("parity") or {}).get("maxRelativeError"))
    summary.onnx_parity_error = parity if parity is not None else summary.onnx_parity_error
    metrics = artifacts.get("metrics") or {}
    if isinstance(metrics.get("step"), int):
        summary.steps = metrics["step"]
    for name, attribute in (("loss", "final_loss"), ("imagesPerSecond", "images_per_second")):
        value = _number(metrics.get(name))
        if value is not None:
            setattr(summary, attribute, value)


def _add_engine_report(summary: RunSummary, workdir: Workdir) -> None:
    """The engine report of `dtrain build-engine` (dtrain_operator.api.engine_report)."""
    if not summary.engine_asked:
        return
    report = EngineReport.read(_read_json(workdir.engine_report))
    if report is None:
        return
    summary.engine_report = str(workdir.engine_report)
    summary.engine_backend = report.backend
    threads = (report.timing or {}).get("cpu_threads")
    summary.latency_threads = threads if isinstance(threads, int) else None
    summary.engine_path = report.engine
    notes = report.notes or []
    if report.error:
        summary.engine_note = report.error
    elif summary.engine_path is None and notes:
        summary.engine_note = notes[0]
    for row in report.latency or []:
        summary.latency.append(
            LatencyRow(
                batch=row.batch_size or 0,
                latency_ms=row.median_ms,
                eager_ms=row.pytorch.median_ms if row.pytorch is not None else None,
            )
        )
