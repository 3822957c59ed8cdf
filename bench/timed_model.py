"""dtrain's built-in image classifier with the benchmark's step clock in its batch-end hook.

The trainer benchmark names this class as the job's `model.classPath`, the way a user
names their own LightningModule; everything else about the run is dtrain's own. The
hook costs one `time.perf_counter()` per batch.
"""

from __future__ import annotations

from typing import Any

from dtrain_trainer.models import ImageClassifier

from .step_clock import StepClock


class TimedImageClassifier(ImageClassifier):
    def __init__(self, **init_args: Any) -> None:
        super().__init__(**init_args)
        self.step_clock = StepClock()
        self.timed_batch_size = 0

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        self.step_clock.tick()
        self.timed_batch_size = len(batch[0])

    def on_train_end(self) -> None:
        super().on_train_end()
        self.step_clock.save(self.timed_batch_size)
