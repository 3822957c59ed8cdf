"""Live progress from rank 0, through a pluggable sink that can never fail or slow training.

The sink is chosen by DTRAIN_PROGRESS_SINK:

- `kubernetes`: merge-patches `status.progress` and `status.lastCheckpoint` of the
  DistributedTraining named by DTRAIN_JOB_NAME in DTRAIN_JOB_NAMESPACE, with the pod's
  service account (or a kubeconfig outside a pod), from a background thread; and prints
  the `stdout` lines too, so that `kubectl logs` shows progress.
- `stdout`: one human line per record (the default when the variable is unset).
- `jsonl:<path>`: one JSON object per line, appended to <path> and flushed per line.
  `dtrain run` reads this file to draw its progress bar.
- `none`: nothing.

Progress records are rate-limited to one per DTRAIN_PROGRESS_INTERVAL_SECONDS (default
15) plus one at each epoch end and at the end of training; events are always sent.
A sink that raises is reported once as a warning and then ignored.

JSONL record format (every record has `event` and `time`, an RFC 3339 UTC timestamp;
fields that are not known yet are null; consumers must ignore fields they do not know):

    {"event": "start", "time": ..., "jobName": "quickstart", "worldSize": 2, "nodes": 2,
     "devicesPerNode": 1, "accelerator": "cpu", "precision": "32-true",
     "clusterEnvironment": "TorchElasticEnvironment", "maxSteps": -1, "maxEpochs": 2,
     "resumeFrom": "/ckpt/last.ckpt" | null,
     "lightning": "lightning.pytorch" | "pytorch_lightning"}   (the package the job trains with)
    {"event": "warning", "time": ..., "message": "precision 16-mixed needs a CUDA GPU ..."}
    {"event": "resumed", "time": ..., "path": "/ckpt/last.ckpt", "step": 40, "epoch": 1}
    {"event": "progress", "time": ..., "epoch": 0, "step": 12, "totalSteps": 128 | null,
     "loss": 2.301, "imagesPerSecond": 812.5 | null, "epochEnd": false,
     "stage": "training" | "validating" | "checkpointing" | "exporting",
     "metrics": {"val_loss": 0.41, "val_acc": 0.87, ...}, "validation": "val_loss=0.41" | null,
     "batches": 512, "batchTime": ...,
     "stepTimes": {"step": 150, "medianSeconds": 0.09, "slowestRank": 1, "slowestSeconds": 0.31,
                   "slowestPod": "job-1", "slowestNode": "node-b", "ratio": 3.4, "slowChecks": 3,
                   "straggler": true} | null}   (metrics: val_loss, val_acc, prog_bar and spec.logging.metrics;
     stepTimes: see stragglers.py)   (the last progress record, before the export, says exporting)
    {"event": "checkpoint", "time": ..., "step": 20, "path": "/ckpt/step=00000020.ckpt"}
    {"event": "export", "time": ..., "ok": true, "onnx": "/art/model.onnx",
     "parityError": 2.1e-07, "tolerance": 0.001, "artifacts": "/art/artifacts.json", "error": null}
    {"event": "finished", "time": ..., "ok": true, "step": 128, "epoch": 1, "loss": 0.41,
     "imagesPerSecond": 815.0, "exportError": "torch.onnx.export failed ..." (only when the export failed)}
    {"event": "stopped", "time": ..., "signal": "SIGTERM", "checkpoint": "/ckpt/last.ckpt", "step": 57,
     "epoch": 0, "loss": 0.9, "imagesPerSecond": 810.2}   (SIGTERM: every rank stopped after this step)
    {"event": "error", "time": ..., "message": "model.classPath: cannot import 'mypkg' ..."}
    {"event": "preflight", "time": ..., "backend": "gloo", "worldSize": 2, "seconds": 0.12,
     "joinSeconds": 0.01, "allReduceBytes": 4194304, "allReduceMs": 9.4, "latencyMs": 0.09,
     "busBandwidthGBps": 0.45, "versions": {...}, "ranks": [...]}   (see preflight.py)

`batches` counts the training and validation batches rank 0 has completed in this process, and
`batchTime` is when the latest completed: only the training and validation loops advance them (the
operator's progress deadline watches them, see dtrain_operator.progress_deadline). A record with
stage `checkpointing` is sent when a checkpoint starts to be written (the deadline holds meanwhile),
one with stage `validating` during validation, at the same rate as training's.

`step` is Lightning's global step (optimizer steps; with gradient accumulation one step
is several batches). `totalSteps` is the number of optimizer steps the run will take
when that is known. `loss` is rank 0's training loss as the model computed it (what it
logs as train_loss), averaged over the batches of the latest optimizer step (all
accumulateGradBatches of them), not Lightning's loss divided by accumulateGradBatches. `imagesPerSecond` counts
the images of all ranks (the batch of each rank times the world size), excluding the
first WARMUP_BATCHES batches of each process and the time between epochs (validation).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, Protocol

log = logging.getLogger("dtrain_trainer")

EVENT_START = "start"
EVENT_WARNING = "warning"
EVENT_RESUMED = "resumed"
EVENT_PROGRESS = "progress"
EVENT_CHECKPOINT = "checkpoint"
EVENT_EXPORT = "export"
EVENT_FINISHED = "finished"
EVENT_STOPPED = "stopped"
EVENT_ERROR = "error"
EVENT_PREFLIGHT = "preflight"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


class Sink(Protocol):
    def send(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def describe_failure(exc: BaseException) -> str:
    """A short, secret-free description of why a request failed."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


class ProgressReporter:
    """Sends records to a sink: events at once, progress at most once per interval unless forced.

    A sink that raises is warned about once and then ignored, so that reporting can never
    stop training.
    """

    def __init__(self, sink: Sink, interval_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self.interval = interval_seconds
        self.clock = clock
        self._last_progress: float | None = None
        self._broken = False

    def _send(self, record: dict[str, Any]) -> None:
        if self._broken:
            return
        try:
            self.sink.send(record)
        except Exception as exc:  # a full disk or a closed pipe must not stop training
            self._broken = True
            log.warning(
                "progress sink %s failed (%s); progress is no longer reported",
                type(self.sink).__name__,
                describe_failure(exc),
            )

    def event(self, event: str, **fields: Any) -> None:
        self._send({"event": event, "time": utc_now(), **fields})

    def progress_due(self) -> bool:
        return self._last_progress is None or self.clock() - self._last_progress >= self.interval

    def progress(self, **fields: Any) -> None:
        self._last_progress = self.clock()
        self.event(EVENT_PROGRESS, **fields)

    def close(self) -> None:
        try:
            self.sink.close()
        except Exception as exc:
            if not self._broken:
                log.warning(
                    "progress sink %s failed while closing (%s)", type(self.sink).__name__, describe_failure(exc)
                )

