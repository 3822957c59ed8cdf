"""The results a container leaves in its termination message, typed: the trainer's and the engine's.

Kubernetes keeps a container's termination message (at most 4 KiB) in the pod's status; the
operator merges the JSON object there into status.artifacts, every field of it, known or not
(`read_termination_message`). `dtrain run` reads the same file the trainer writes, and
`dtrain watch` reads status.artifacts back as these records (tolerantly, see records.WireRecord).

    trainer, after training:  {"ok": true, "step": 128, "epoch": 1, "loss": 0.41, "imagesPerSecond": 815.0,
                               "metrics": {...}, "validation": "val_loss=0.41",
                               "onnx": "/art/model.onnx", "sha256": ..., "parityError": 2.1e-07,
                               "artifacts": "/art/artifacts.json"}   (or "exportError": "..." instead of the ONNX fields)
    trainer, stopped:         {"ok": false, "stopped": "SIGTERM", "checkpoint": "/ckpt/last.ckpt", "step": 57, ...}
    engine:                   {"kind": "engine", "passed": true, "backend": "tensorrt", "engine": "/art/model.plan",
                               "report": "/art/engine-report.json", "precision": "fp16", "maxRelativeError": 0.002,
                               "bound": 0.01, "latency": [[batch, median ms, p99 ms, images/s, speed-up over PyTorch]],
                               "message": "..." (why no engine was built, or what failed)}
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import ConfigDict

from dtrain_operator.api import contract
from dtrain_operator.api.records import Metrics, WireRecord


class TrainerResults(WireRecord):
    """What rank 0's trainer leaves in its termination message when it ends (dtrain_trainer.export)."""

    ok: bool | None = None
    step: int | None = None
    epoch: int | None = None
    loss: float | None = None
    images_per_second: float | None = None
    metrics: Metrics | None = None
    validation: str | None = None
    onnx: str | None = None
    sha256: str | None = None
    parity_error: float | None = None
    artifacts: str | None = None
    """artifacts.json, the export's whole record."""
    export_error: str | None = None
    """Why there is no model.onnx although training succeeded (its wire name is contract.RESULTS_KEY_EXPORT_ERROR)."""
    stopped: str | None = None
    """The signal that stopped training."""
    checkpoint: str | None = None
    """The checkpoint a stopped training saved."""


EngineLatencyRow = list[int | float | None]


class EngineResults(WireRecord):
    """What `dtrain build-engine` leaves in its termination message (dtrain_engine.report)."""

    # As the report: an unmeasurable speed (a zero median) is written as Infinity.
    model_config = ConfigDict(allow_inf_nan=True)

    kind: Literal["engine"]
    """Tells the engine's results from the trainer's in status.artifacts, where both are merged."""
    passed: bool | None = None
    backend: str | None = None
    engine: str | None = None
    report: str | None = None
    precision: str | None = None
    max_relative_error: float | None = None
    bound: float | None = None
    latency: list[EngineLatencyRow] | None = None
    """[batch, median ms, p99 ms, images/s, speed-up over PyTorch] per timed shape."""
    message: str | None = None


def read_termination_message(message: str) -> dict[str, Any] | None:
    """The JSON object a trainer or engine container left in its termination message, if it is one."""
    text = message.strip()
    if not text.startswith("{") or len(text.encode()) > contract.TERMINATION_MESSAGE_MAX_BYTES:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
