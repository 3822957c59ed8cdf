"""SIGTERM stops training at a step boundary, with a checkpoint, on every rank at the same step.

A pod gets SIGTERM when it is deleted, preempted or its node is drained; torchrun passes
it to each worker. Every rank then asks, at each optimizer step, whether any rank was
told to stop (one all-reduce of one number, over a gloo group of its own so that it
never synchronises a GPU stream); when one was, all ranks stop after the same step, the
checkpoint callback saves that step (its collectives need every rank), and the trainer
exits 143, as a process killed by SIGTERM would.

Lightning's own SIGTERM handler is replaced while training runs: it broadcasts from
inside the signal handler, which deadlocks when the ranks are signalled at different
moments, and saves nothing.
"""

from __future__ import annotations

import logging
import signal
import threading
from datetime import timedelta
from types import FrameType
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from dtrain_trainer import flavor

log = logging.getLogger("dtrain_trainer")

STOP_SIGNAL = signal.SIGTERM
# A process stopped by SIGTERM exits 128 + 15, whether the signal killed it or it stopped itself.
STOPPED_EXIT_CODE = 128 + int(STOP_SIGNAL)


class _GracefulStopBehaviour:
    """Stop on SIGTERM at the next optimizer step of every rank, after a checkpoint of that step."""

    def __init__(self, collective_timeout: timedelta) -> None:
        super().__init__()
        # The flag's all-reduce waits no longer than the training's collectives (nccl.timeoutSeconds): a new
        # group's own default is 30 minutes, which a peer whose link is cut mid-reduce would hold the gang for.
        self._collective_timeout = collective_timeout
        self.signalled = False
        self.stopped_at_step: int | None = None
        self._group: Any = None
        self._previous: Any = None
        self._last_step: int | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Every rank runs setup, in the same order: the place to create a group collectively.
        if stage == "fit" and dist.is_available() and dist.is_initialized() and trainer.world_size > 1:
            self._group = dist.new_group(backend="gloo", timeout=self._collective_timeout)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_step = trainer.global_step
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(STOP_SIGNAL, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: the training thread acts on it at the next step boundary.
        self.signalled = True

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self._last_step:
            return  # accumulating gradients: not a step boundary
        self._last_step = trainer.global_step
        if not self.any_rank_signalled():
            return
        self.stopped_at_step = trainer.global_step
        log.warning("%s: stopping at step %d and saving a checkpoint", STOP_SIGNAL.name, trainer.global_step)
        for callback in trainer.callbacks:  # type: ignore[attr-defined]
            save_now = getattr(callback, "save_now", None)
            if callable(save_now):
                save_now(trainer)
        trainer.should_stop = True

    def any_rank_signalled(self) -> bool:
        """Whether SIGTERM reached any rank; every rank calls it, at each step boundary and once fit returns."""
        if self._group is None:
            return self.signalled
        flag = torch.tensor([1 if self.signalled else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        return bool(flag.item())

    # Not given back at train end: the final checkpoint is written after it, and Lightning's own handler does a
    # collective broadcast inside the signal handler, which a SIGTERM during that save (a rank in the save's
    # barrier, another in the broadcast) turned into a deadlock until torchrun's SIGKILL.
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._previous is None or threading.current_thread() is not threading.main_thread():
            return
        # Lightning's teardown, before the callbacks', gives back the handlers it found (its own included):
        # re-installing the one this replaced would bring Lightning's back after fit.
        if signal.getsignal(STOP_SIGNAL) == self._handle:
            signal.signal(STOP_SIGNAL, self._previous)
        self._previous = None


class GracefulStop(_GracefulStopBehaviour, L.Callback):
    __doc__ = _GracefulStopBehaviour.__doc__


def graceful_stop_class(package: str) -> type:
    """GracefulStop on `package`'s Callback (lightning.pytorch or pytorch_lightning)."""
    return flavor.callback_class(package, _GracefulStopBehaviour, GracefulStop)
