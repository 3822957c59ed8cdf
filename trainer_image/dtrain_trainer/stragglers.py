"""Straggler detection: every few steps, each rank's step time is gathered and rank 0 names the slowest.

In DDP every rank waits for the slowest in the gradient all-reduce, so wall time per step is the
same everywhere and says nothing about who is slow. What differs is the time a rank spends on a
step *before* any collective: from `on_train_batch_start` (its batch loaded and on its device) to
the start of its backward pass, the forward and the loss, measured here on every rank. (Loading the
batch is not in it: Lightning broadcasts a SIGTERM flag from rank 0 before each fetch, a collective
at which fast ranks wait for slow ones, and no hook lies between the two.) Every spec.stragglers.everyNSteps
optimizer steps the ranks all-gather their mean of it (one number each: a few bytes on gloo or
NCCL); rank 0 takes the median and the slowest rank, counts the comparisons in a row in which the
same rank was slower than `factor` times the median, and marks it a straggler once that count
reaches `window`. Rank 0 puts the result in its progress records (status.progress.stepTimes, with
the slowest rank's pod and node from the downward API) and sends one at once when a straggler is
first marked, so that the operator's Straggler condition and Warning Event follow within seconds.
Nothing is restarted.
"""

from __future__ import annotations

import functools
import os
import socket
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from dtrain_operator.api import StragglerSettings, contract
from dtrain_trainer import flavor


def compare(seconds: list[float], factor: float, previous: Mapping[str, Any] | None, window: int) -> dict[str, Any]:
    """The comparison of one gathering (rank by rank seconds), continuing the count of `previous`."""
    median = statistics.median(seconds)
    slowest = max(range(len(seconds)), key=lambda r: seconds[r])
    ratio = seconds[slowest] / median if median > 0 else 1.0
    slow = ratio > factor
    earlier = previous or {}
    same = earlier.get("slowestRank") == slowest
    checks = (int(earlier.get("slowChecks") or 0) + 1 if same else 1) if slow else 0
    return {
        "medianSeconds": round(median, 6),
        "slowestRank": slowest,
        "slowestSeconds": round(seconds[slowest], 6),
        "ratio": round(ratio, 3),
        "slowChecks": checks,
        "straggler": checks >= window,
    }


class _StragglerBehaviour:
    """Times each rank's step before its backward pass and compares the ranks every few steps."""

    def __init__(
        self,
        settings: StragglerSettings,
        publish: Callable[[dict[str, Any], bool], None],
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.publish = publish
        env = os.environ if env is None else env
        self.identity = (env.get(contract.ENV_POD_NAME) or env.get("HOSTNAME") or socket.gethostname(),
                         env.get(contract.ENV_NODE_NAME))
        self.identities: list[Any] = []
        self.latest: dict[str, Any] | None = None
        self._mark: float | None = None
        self._sum = 0.0
        self._count = 0
        self._last_check: int | None = None

    def _active(self, trainer: L.Trainer) -> bool:
        return self.settings.every_n_steps > 0 and trainer.world_size > 1 and dist.is_available() and dist.is_initialized()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_check = trainer.global_step
        if self._active(trainer):
            gathered: list[Any] = [None] * trainer.world_size
            dist.all_gather_object(gathered, self.identity)
            self.identities = gathered

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self._mark = time.perf_counter()

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        if self._mark is not None:
            self._sum += time.perf_counter() - self._mark
            self._count += 1
            self._mark = None

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if self._active(trainer) and step != self._last_check and step % self.settings.every_n_steps == 0:
            self._last_check = step
            self._gather(trainer, pl_module, step)

    def _gather(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        mine = self._sum / self._count if self._count else 0.0
        self._sum, self._count = 0.0, 0
        device = pl_module.device if dist.get_backend() == "nccl" else torch.device("cpu")
        local = torch.tensor([mine], dtype=torch.float64, device=device)
        parts = [torch.zeros_like(local) for _ in range(trainer.world_size)]
        dist.all_gather(parts, local)
        if not trainer.is_global_zero:
            return
        seconds = [float(p.item()) for p in parts]
        result = compare(seconds, self.settings.factor, self.latest, self.settings.window)
        pod, node = (self.identities[result["slowestRank"]] if self.identities else (None, None))
        result = {"step": step, **result, "slowestPod": pod, "slowestNode": node}
        newly = result["straggler"] and not (self.latest or {}).get("straggler")
        cleared = not result["straggler"] and (self.latest or {}).get("straggler")
        self.latest = result
        self.publish(result, bool(newly or cleared))


class StragglerCallback(_StragglerBehaviour, L.Callback):
    __doc__ = _StragglerBehaviour.__doc__


@functools.cache
def straggler_callback_class(package: str) -> type:
    """StragglerCallback on `package`'s Callback (lightning.pytorch or pytorch_lightning)."""
    if package == flavor.LIGHTNING:
        return StragglerCallback
    base = flavor.flavor(package).Callback
    return type("StragglerCallback", (_StragglerBehaviour, base), {"__module__": __name__})
