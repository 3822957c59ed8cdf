"""One clock for both sides of the trainer benchmark: a timestamp at the end of every training batch.

The raw DDP loop ticks it after each batch; dtrain's trainer ticks it from the model's
`on_train_batch_end` hook (bench.timed_model). Throughput is then computed from these
timestamps in the same way for both, so start-up, warm-up and the end of the run
(final checkpoint, export) stay out of the steady-state number.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

# Not DTRAIN_*: that prefix belongs to the operator–trainer contract (contract.py).
ENV_CLOCK_DIR = "BENCH_STEP_CLOCK_DIR"


class StepClock:
    """Batch-end times of this process, written to <dir>/rank-<RANK>.json by `save`."""

    def __init__(self) -> None:
        self.batch_end_times: list[float] = []

    def tick(self) -> None:
        self.batch_end_times.append(time.perf_counter())

    def save(self, batch_size: int) -> Path | None:
        directory = os.environ.get(ENV_CLOCK_DIR)
        if not directory:
            return None
        rank = int(os.environ.get("RANK", "0"))
        path = Path(directory) / f"rank-{rank}.json"
        path.write_text(
            json.dumps(
                {
                    "rank": rank,
                    "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                    "batch_size": batch_size,
                    "batch_end_times": self.batch_end_times,
                }
            )
        )
        return path


def steady_images_per_second(batch_end_times: list[float], warmup_batches: int, images_per_batch: int) -> float:
    """Images per second between the end of the warm-up batches and the end of the last batch."""
    if len(batch_end_times) <= warmup_batches:
        raise ValueError(
            f"only {len(batch_end_times)} batches were timed; need more than the {warmup_batches} warm-up batches"
        )
    start = batch_end_times[warmup_batches - 1] if warmup_batches > 0 else batch_end_times[0]
    counted = len(batch_end_times) - max(warmup_batches, 1)
    return counted * images_per_batch / (batch_end_times[-1] - start)


def median_batch_images_per_second(batch_end_times: list[float], warmup_batches: int, images_per_batch: int) -> float:
    """Images per second of the median batch after warm-up: robust to another process's burst of load,
    but blind to rare slow batches (epoch ends) that are part of the real cost."""
    start = max(warmup_batches, 1)
    durations = sorted(b - a for a, b in zip(batch_end_times[start - 1 :], batch_end_times[start:]))
    if not durations:
        raise ValueError("no batches after the warm-up")
    middle = len(durations) // 2
    median = durations[middle] if len(durations) % 2 else (durations[middle - 1] + durations[middle]) / 2
    return images_per_batch / median
