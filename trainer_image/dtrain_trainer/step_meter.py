"""The measuring of where a rank's step time goes, at hooks the trainer already passes through.

Per optimizer step, on every rank, summed over the window between two comparisons
(dtrain_trainer.stragglers gathers them; dtrain_trainer.step_breakdown names the bottleneck):

- **dataWait**: blocked in the training loader's `__next__`. Lightning's fit loop times that call
  itself for its profiler (the action `[_TrainingEpochLoop].train_dataloader_next`), so the Trainer
  gets a profiler that only reads those two moments (`LoaderWaitProfiler`); the loader, its
  sampler and its resumable state are not touched. The SIGTERM broadcast Lightning runs before each
  fetch (a collective at which fast ranks wait for slow ones) is outside it.
- **forward**: from the start of the module's forward inside DDP (a forward pre-hook on the module
  DDP wraps) to `on_before_backward`: the forward pass and the loss (and zero_grad, which Lightning
  runs between them). DDP first broadcasts the model's buffers (BatchNorm's running statistics)
  from rank 0, a collective at which ranks wait for the slowest: that time, from
  `on_train_batch_start` (the batch on its device), counts as allReduce.
- **backward** and **allReduce**: DDP all-reduces the gradients in buckets while the backward pass
  runs, and `backward()` returns once every bucket's all-reduce has completed. A communication hook
  (DDP's own allreduce_hook, with a mark when the last bucket is handed to it: by then every gradient
  is computed) splits that time: backward up to the last bucket, allReduce from it to the end of
  `backward()`, the part of the all-reduce not overlapped with the backward pass, waiting for slower
  ranks included. Micro-batches under gradient accumulation run no all-reduce: all backward. So
  allReduce is a rank's time in DDP's two collectives, most of it waiting for slower ranks.
- **optimizer**: from `on_before_optimizer_step` (after the closure's backward) to
  `on_train_batch_end`: gradient clipping, the optimizer's step and the LR scheduler's.

Not in any part: Lightning's own bookkeeping between hooks, other callbacks' hooks before this
one's, the SIGTERM broadcast, checkpoints, validation, the comparisons themselves.

On the CPU the marks are `time.perf_counter()`. On a GPU the CPU runs ahead of the device, so the
marks are CUDA events on the current stream, read once the GPU has passed them: each part is then
GPU time, and dataWait is the time the GPU stood idle for the batch (none when the loader kept
ahead). The event path is not exercised by the CPU test suite.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import lightning as L
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from dtrain_trainer import flavor
from dtrain_trainer.step_breakdown import ALL_REDUCE, BACKWARD, CATEGORIES, DATA_WAIT, FORWARD, OPTIMIZER

# The action Lightning's training epoch loop profiles around each fetch of a training batch.
TRAIN_FETCH_ACTION = "].train_dataloader_next"


class IntervalClock:
    """Marks, and the seconds between two marks summed by category: perf_counter on the CPU; CUDA events on a
    GPU, read once the GPU has passed both (pending meanwhile, settled at each step's end)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.totals = dict.fromkeys(CATEGORIES, 0.0)
        self._pending: list[tuple[str, Any, Any]] = []

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, category: str, start: Any, end: Any) -> None:
        if self.cuda:
            self._pending.append((category, start, end))
        else:
            self.totals[category] += end - start

    def settle(self, wait: bool = False) -> None:
        """Add the intervals the GPU has passed (with `wait`, all of them, waiting for the GPU)."""
        left = []
        for category, start, end in self._pending:
            if wait:
                end.synchronize()
            if wait or (start.query() and end.query()):
                self.totals[category] += start.elapsed_time(end) / 1000
            else:
                left.append((category, start, end))
        self._pending = left

    def take(self) -> dict[str, float]:
        """The totals since the last take, every interval settled."""
        self.settle(wait=True)
        totals, self.totals = self.totals, dict.fromkeys(CATEGORIES, 0.0)
        return totals


class _StepMeterBehaviour:
    """Times each part of every optimizer step on this rank (see the module's docstring)."""

    def __init__(self) -> None:
        self.clock: IntervalClock | None = None
        self.micro_batches = 0
        self._window_start = 0
        self._fetch: Any = None
        self._batch_start: Any = None
        self._forward: Any = None
        self._backward: Any = None
        self._last_bucket: Any = None
        self._optimizer: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.clock = IntervalClock(pl_module.device)
        self._window_start = trainer.global_step
        model = trainer.strategy.model
        if isinstance(model, DistributedDataParallel):
            # A lambda: DDP refuses a hook annotated with other than its own types, and postponed annotations are strings.
            model.register_comm_hook(model.process_group, lambda group, bucket: self._timed_allreduce(group, bucket))
            model.module.register_forward_pre_hook(lambda module, args: self._forward_starts())

    def _forward_starts(self) -> None:
        """The module's forward starts inside DDP's, after DDP's broadcast of the buffers: that was a collective.
        Only the first call of a batch counts: a training_step that calls the module (self(x)) calls it again."""
        if self.clock is not None and self._batch_start is not None:
            self._forward = self.clock.mark()
            self.clock.add(ALL_REDUCE, self._batch_start, self._forward)
            self._batch_start = None

    def _timed_allreduce(self, process_group: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        """DDP's own all-reduce of a bucket; the last bucket of a backward pass marks its gradients all computed."""
        if bucket.is_last() and self.clock is not None:
            self._last_bucket = self.clock.mark()
        return default_hooks.allreduce_hook(process_group, bucket)

    def fetch_started(self) -> None:
        if self.clock is not None:
            self._fetch = self.clock.mark()

    def fetch_ended(self) -> None:
        if self.clock is not None and self._fetch is not None:
            self.clock.add(DATA_WAIT, self._fetch, self.clock.mark())
            self._fetch = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.clock is not None:
            self._forward = self._batch_start = self.clock.mark()

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if self.clock is not None and self._forward is not None:
            self._backward = self.clock.mark()
            self.clock.add(FORWARD, self._forward, self._backward)
            self.micro_batches += 1
            self._forward = None

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.clock is None or self._backward is None:
            return
        end = self.clock.mark()
        if self._last_bucket is None:
            self.clock.add(BACKWARD, self._backward, end)
        else:
            self.clock.add(BACKWARD, self._backward, self._last_bucket)
            self.clock.add(ALL_REDUCE, self._last_bucket, end)
        self._backward = self._last_bucket = None

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        if self.clock is not None:
            self._optimizer = self.clock.mark()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.clock is None:
            return
        if self._optimizer is not None:
            self.clock.add(OPTIMIZER, self._optimizer, self.clock.mark())
        # A batch whose training_step returned None had no backward: nothing of it is left open.
        self._batch_start = self._forward = self._backward = self._last_bucket = self._optimizer = None
        self.clock.settle()

    def take(self, step: int) -> tuple[dict[str, float], int, int]:
        """(each category's seconds, optimizer steps, micro-batches) since the last take, which `step` ends."""
        totals = self.clock.take() if self.clock is not None else dict.fromkeys(CATEGORIES, 0.0)
        steps, micro_batches = step - self._window_start, self.micro_batches
        self._window_start, self.micro_batches = step, 0
        return totals, steps, micro_batches


class StepMeter(_StepMeterBehaviour, L.Callback):
    __doc__ = _StepMeterBehaviour.__doc__


def step_meter_class(package: str) -> type:
    """StepMeter on `package`'s Callback (lightning.pytorch or pytorch_lightning)."""
    return flavor.callback_class(package, _StepMeterBehaviour, StepMeter)


class _LoaderWaitBehaviour:
    """A profiler that profiles nothing but tells the step meter when a training batch's fetch starts and ends."""

    def __init__(self, meter: _StepMeterBehaviour) -> None:
        super().__init__()
        self.meter = meter

    def start(self, action_name: str) -> None:
        if action_name.endswith(TRAIN_FETCH_ACTION):
            self.meter.fetch_started()

    def stop(self, action_name: str) -> None:
        if action_name.endswith(TRAIN_FETCH_ACTION):
            self.meter.fetch_ended()


@functools.cache
def loader_wait_profiler_class(package: str) -> type:
    """LoaderWaitProfiler on `package`'s PassThroughProfiler (lightning.pytorch or pytorch_lightning)."""
    base = flavor.flavor(package).profilers.PassThroughProfiler
    return type("LoaderWaitProfiler", (_LoaderWaitBehaviour, base), {"__module__": __name__})
