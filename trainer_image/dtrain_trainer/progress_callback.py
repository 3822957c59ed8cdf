"""The Lightning callback through which rank 0 reports progress, throughput and the checkpoint it resumed from."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning as L
import torch

from dtrain_operator.api import SurvivorMark, contract
from dtrain_operator.api.records import Event
from dtrain_trainer import flavor
from dtrain_trainer.progress import ProgressReporter, utc_now

log = logging.getLogger("dtrain_trainer")
SURVIVOR_KEY = contract.CHECKPOINT_SURVIVOR_KEY

# Metrics reported whenever the model logs them (besides its prog_bar metrics and spec.logging.metrics).
REPORTED_METRICS = ("val_loss", "val_acc")
# Batches at the start of each process that throughput leaves out: CUDA context,
# cuDNN autotuning and allocator growth make them unrepresentative.
WARMUP_BATCHES = 5


def validation_text(metrics: Mapping[str, float]) -> str | None:
    """The first validation metric as name=value (the VAL column of `kubectl get dtr`)."""
    name = next((n for n in metrics if n.startswith("val")), None)
    return None if name is None else f"{name}={metrics[name]:.4g}"


class ThroughputMeter:
    """Images per second over all ranks, leaving out warm-up batches and the time between epochs."""

    def __init__(self, warmup_batches: int = WARMUP_BATCHES, clock: Callable[[], float] = time.monotonic) -> None:
        self.warmup_batches = warmup_batches
        self.clock = clock
        self._batches = 0
        self._images = 0
        self._seconds = 0.0
        self._mark: float | None = None

    def epoch_start(self) -> None:
        self._mark = self.clock()

    def batch_done(self, images: int) -> None:
        now = self.clock()
        elapsed = 0.0 if self._mark is None else now - self._mark
        self._mark = now
        self._batches += 1
        if self._batches > self.warmup_batches:
            self._images += images
            self._seconds += elapsed

    def images_per_second(self) -> float | None:
        if self._images == 0 or self._seconds <= 0:
            return None
        # One decimal: what `kubectl get dtr` prints in IMG/S as it is (the column cannot format).
        return round(self._images / self._seconds, 1)


def batch_size_of(batch: Any) -> int | None:
    """Samples in a batch: the leading dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size_of(batch[0])
    if isinstance(batch, Mapping) and batch:
        return batch_size_of(next(iter(batch.values())))
    return None


def loss_of(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, torch.Tensor):
        return outputs.detach()
    if isinstance(outputs, Mapping) and isinstance(outputs.get("loss"), torch.Tensor):
        return outputs["loss"].detach()
    return None


class _ProgressBehaviour:
    """Rank 0's reports of progress and of the checkpoint a run resumed from.

    The loss is read from the GPU (a synchronisation) only when a record is sent.
    """

    def __init__(
        self,
        reporter: ProgressReporter,
        default_batch_size: int,
        meter: ThroughputMeter | None = None,
        metric_names: Sequence[str] = (),
    ):
        self.reporter = reporter
        self.metric_names = tuple(metric_names)
        self.default_batch_size = default_batch_size
        self.meter = meter or ThroughputMeter()
        self._loss: torch.Tensor | None = None
        self.last_loss: float | None = None
        self._window_sum: torch.Tensor | None = None
        self._window_batches = 0
        self._window_step: int | None = None
        self.total_steps: int | None = None
        # The epoch of the latest batch: after fit, Lightning's current_epoch is one past the last epoch.
        self.last_epoch: int | None = None
        # Training and validation batches completed in this process, and when the latest did.
        self.batches = 0
        self.batch_time: str | None = None
        self._stage = contract.PROGRESS_STAGE_TRAINING
        # The latest comparison of the ranks' step times (dtrain_trainer.stragglers).
        self.step_times: dict[str, Any] | None = None
        # Where the ranks' step time went at the latest comparison (dtrain_trainer.step_breakdown).
        self.step_breakdown: dict[str, Any] | None = None
        self._trainer: Any = None
        self._stage_before_write = contract.PROGRESS_STAGE_TRAINING

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        step = checkpoint.get("global_step")
        survivor = SurvivorMark.model_validate(checkpoint[SURVIVOR_KEY]) if SURVIVOR_KEY in checkpoint else None
        by = f" (saved by surviving rank {survivor.rank} after a peer was lost)" if survivor else ""
        log.info("resumed from %s at step %s%s", trainer.ckpt_path, step, by)
        if trainer.is_global_zero:
            self.reporter.event(
                Event.RESUMED, path=str(trainer.ckpt_path), step=step, epoch=checkpoint.get("epoch"),
                **({"survivor": survivor.to_wire()} if survivor else {}),
            )

    def note_step_times(self, times: dict[str, Any], now: bool) -> None:
        """The stragglers callback's latest comparison; `now`: a straggler appeared or went, report at once."""
        self.step_times = times
        if now and self._trainer is not None:
            self._report(self._trainer, epoch_end=False)

    def note_step_breakdown(self, breakdown: dict[str, Any]) -> None:
        """The latest step breakdown, sent with the next progress record."""
        self.step_breakdown = breakdown

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trainer = trainer
        self._window_step = trainer.global_step
        estimated = trainer.estimated_stepping_batches
        self.total_steps = int(estimated) if math.isfinite(estimated) else None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.meter.epoch_start()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        self._batch_done()
        per_rank = batch_size_of(batch) or self.default_batch_size
        self.meter.batch_done(per_rank * trainer.world_size)
        self._add_loss(trainer, loss_of(outputs))
        self.last_epoch = trainer.current_epoch
        if self.reporter.progress_due() or self._stage != contract.PROGRESS_STAGE_TRAINING:
            self._stage = contract.PROGRESS_STAGE_TRAINING
            self._report(trainer, epoch_end=False)

    def _batch_done(self) -> None:
        self.batches += 1
        self.batch_time = utc_now()

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not trainer.is_global_zero:
            return
        self._batch_done()
        if self.reporter.progress_due() or self._stage != contract.PROGRESS_STAGE_VALIDATING:
            self._stage = contract.PROGRESS_STAGE_VALIDATING
            self._report(trainer, epoch_end=False)

    @property
    def holding(self) -> bool:
        """A checkpoint is being written: the progress deadline's clock holds, and so does the hang watch's."""
        return self._stage == contract.PROGRESS_STAGE_CHECKPOINTING

    def checkpoint_writing(self, writing: bool) -> None:
        """A checkpoint write starts (True) or ends (False): say so at once, so that a long write trips no
        progress deadline and the deadline runs again from the moment it ends (StepCheckpoint calls this)."""
        trainer = self._trainer
        if trainer is None or not trainer.is_global_zero:
            return
        if writing:
            if self._stage != contract.PROGRESS_STAGE_CHECKPOINTING:
                self._stage_before_write = self._stage
                self._stage = contract.PROGRESS_STAGE_CHECKPOINTING
                self._report(trainer, epoch_end=False)
        elif self._stage == contract.PROGRESS_STAGE_CHECKPOINTING:
            self._stage = self._stage_before_write
            self._report(trainer, epoch_end=False)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self._report(trainer, epoch_end=True)

    def _add_loss(self, trainer: L.Trainer, normalised: torch.Tensor | None) -> None:
        """Average the model's own loss over the accumulation window; publish it at each optimizer step.

        Lightning hands on_train_batch_end the loss divided by accumulate_grad_batches (what it
        back-propagates); the model computed that times accumulate_grad_batches.
        """
        if normalised is None:
            return
        loss = normalised * trainer.accumulate_grad_batches
        self._window_sum = loss if self._window_sum is None else self._window_sum + loss
        self._window_batches += 1
        if trainer.global_step != self._window_step:
            self._window_step = trainer.global_step
            self._loss = self._window_sum / self._window_batches
            self._window_sum, self._window_batches = None, 0

    def _read_loss(self) -> None:
        if self._loss is not None:
            value = float(self._loss.float().item())
            self.last_loss = value if math.isfinite(value) else None
            self._loss = None

    def metrics(self, trainer: L.Trainer) -> dict[str, float]:
        """val_loss, val_acc, what the model logs with prog_bar=True and spec.logging.metrics: latest values."""
        shown = trainer.progress_bar_metrics
        logged = trainer.callback_metrics
        names = dict.fromkeys([*REPORTED_METRICS, *shown, *self.metric_names])
        found: dict[str, float] = {}
        for name in names:
            value = shown.get(name, logged.get(name))
            if name == "loss" or value is None:
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                found[name] = number
        return found

    def _epoch(self, trainer: L.Trainer) -> int:
        """The epoch of the latest batch: the final checkpoint is reported after the fit loop, when
        current_epoch has moved one past the last epoch trained."""
        return self.last_epoch if self.last_epoch is not None else trainer.current_epoch

    def _report(self, trainer: L.Trainer, epoch_end: bool) -> None:
        self._read_loss()
        metrics = self.metrics(trainer)
        self.reporter.progress(
            epoch=self._epoch(trainer),
            step=trainer.global_step,
            totalSteps=self.total_steps,
            loss=self.last_loss,
            imagesPerSecond=self.meter.images_per_second(),
            epochEnd=epoch_end,
            stage=self._stage,
            metrics=metrics,
            validation=validation_text(metrics),
            batches=self.batches,
            batchTime=self.batch_time,
            stepTimes=self.step_times,
            stepBreakdown=self.step_breakdown,
        )

    def final_metrics(self, trainer: L.Trainer) -> dict[str, Any]:
        self._read_loss()
        return {
            "loss": self.last_loss,
            "step": trainer.global_step,
            "epoch": self._epoch(trainer),
            "imagesPerSecond": self.meter.images_per_second(),
            "metrics": (metrics := self.metrics(trainer)),
            "validation": validation_text(metrics),
        }


class ProgressCallback(_ProgressBehaviour, L.Callback):
    __doc__ = _ProgressBehaviour.__doc__


def progress_callback_class(package: str) -> type:
    """ProgressCallback on `package`'s Callback (lightning.pytorch or pytorch_lightning)."""
    return flavor.callback_class(package, _ProgressBehaviour, ProgressCallback)
