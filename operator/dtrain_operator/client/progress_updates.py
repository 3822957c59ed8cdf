"""One job's progress as the client reports it: a snapshot of status.progress and a one-line summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dtrain_operator import api


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class ProgressUpdate:
    """One observed state of a job: its phase and rank 0's latest progress report."""

    job: api.DistributedTraining
    phase: str | None
    epoch: int | None = None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    images_per_second: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    stage: str | None = None
    restarts: int = 0
    updated_at: str | None = None

    @classmethod
    def of(cls, job: api.DistributedTraining) -> ProgressUpdate:
        """The update that the job's status shows now."""
        status = job.status or api.DistributedTrainingStatus()
        progress = status.progress or api.Progress()
        extra = progress.model_extra or {}
        # status.progress.metrics (val_acc, ...) and totalSteps where the trainer reports them, whether
        # the model names them as fields or keeps them as extra ones; numbers only.
        raw_metrics = getattr(progress, "metrics", None) or extra.get("metrics")
        raw_metrics = raw_metrics if isinstance(raw_metrics, dict) else {}
        metrics = {str(k): float(v) for k, v in raw_metrics.items() if _number(v) is not None}
        total = getattr(progress, "total_steps", None) or extra.get("totalSteps")
        return cls(
            job=job,
            phase=status.phase,
            epoch=progress.epoch,
            step=progress.step,
            total_steps=total if isinstance(total, int) and not isinstance(total, bool) else None,
            loss=progress.loss,
            images_per_second=progress.images_per_second,
            metrics=metrics,
            stage=progress.stage,
            restarts=status.restarts,
            updated_at=progress.updated_at,
        )

    @property
    def finished(self) -> bool:
        """Whether the job ended (Succeeded or Failed)."""
        return self.phase in api.FINISHED_PHASES

    def key(self) -> tuple[Any, ...]:
        """What makes two updates different (the job's resourceVersion aside)."""
        return (
            self.phase, self.epoch, self.step, self.loss, self.images_per_second,
            tuple(sorted(self.metrics.items())), self.stage, self.restarts, self.updated_at,
        )

    def line(self) -> str:
        """The update as one line, e.g. `Running  epoch 2  step 40  loss 0.31  250 img/s  val_acc 0.95`."""
        parts = [self.phase or "Pending"]
        if self.epoch is not None:
            parts.append(f"epoch {self.epoch + 1}")
        if self.step is not None:
            parts.append(f"step {self.step}" + (f"/{self.total_steps}" if self.total_steps else ""))
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4g}")
        if self.images_per_second is not None:
            parts.append(f"{self.images_per_second:,.0f} img/s")
        parts.extend(f"{name} {value:.4g}" for name, value in self.metrics.items())
        if self.restarts:
            parts.append(f"restarts {self.restarts}")
        return "  ".join(parts)
