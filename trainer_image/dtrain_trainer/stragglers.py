"""Straggler detection: every few steps, each rank's step time and link time are gathered and rank 0 names the slowest.

In DDP every rank waits for the slowest in the gradient all-reduce, so wall time per step is the
same everywhere and says nothing about who is slow. Two things differ, and each is measured on
every rank:

- **step**: the time a rank spends on a step *before* any collective: from `on_train_batch_start`
  (its batch loaded and on its device) to the start of its backward pass, the forward and the
  loss. A slow GPU or CPU shows here. (Loading the batch is not in it: Lightning broadcasts a
  SIGTERM flag from rank 0 before each fetch, a collective at which fast ranks wait for slow ones,
  and no hook lies between the two.)
- **link**: how fast a rank sends. A slow link slows every rank's all-reduce alike, so no time
  inside a collective can name it; instead, at each comparison the ranks of each pair of ring
  neighbours fetch `contract.LINK_PROBE_BYTES` from each other (point-to-point, after a handshake that
  waits for both to be there, the best of `LINK_PROBE_REPEATS`), and a rank's link time is the
  faster of its two neighbours' fetches from it: only a rank whose own link is slow is slow in
  both, a neighbour of it only in one. A link time under `LINK_SLOW_FLOOR_SECONDS` is never slow. With 2 ranks both fetches go over the same pair of links,
  so a link that is slow in both directions cannot be told from its peer's; one slow to send can.

The step time is the step meter's forward (dtrain_trainer.step_meter), per micro-batch. Every
spec.stragglers.everyNSteps optimizer steps the ranks probe their links and all-gather their mean
step time, link times and step breakdown (eight numbers each: a few bytes on gloo or NCCL); rank 0
compares each measure on its own: the median and the slowest rank, the comparisons in a row in
which the same rank was slower than `factor` times the median, a straggler once that count
reaches `window`. Rank 0 puts the comparison that names a straggler (else the step times) in its
progress records (status.progress.stepTimes, with the slowest rank's pod and node from the
downward API) and sends one at once when a straggler is first marked, so that the operator's
Straggler condition and Warning Event follow within seconds. Nothing is restarted. Rank 0 also
reports where each rank's step time goes (status.progress.stepBreakdown, see
dtrain_trainer.step_breakdown). With everyNSteps 0 there is no link probe and no comparison, but the
breakdown is still gathered, every BREAKDOWN_EVERY_N_STEPS steps.
"""
from __future__ import annotations

import math
import os
import socket
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

from dtrain_operator.api import StragglerSettings, TrainerConfig, contract
from dtrain_trainer import flavor, step_breakdown
from dtrain_trainer.step_meter import _StepMeterBehaviour, loader_wait_profiler_class, step_meter_class

# The best of a few fetches: a process descheduled once on a busy machine only adds time.
LINK_PROBE_REPEATS = 3
# A link time under this is never slow, whatever its ratio to the median: contract.LINK_PROBE_BYTES in 5 ms is
# 13 Gb/s, and below it, on a busy machine, the time is the scheduler's more than the link's.
LINK_SLOW_FLOOR_SECONDS = 0.005
STEP, LINK = "step", "link"
# How often the step breakdown is gathered when straggler detection is off (spec.stragglers.everyNSteps 0).
BREAKDOWN_EVERY_N_STEPS = 50


def compare(
    seconds: list[float], factor: float, previous: Mapping[str, Any] | None, window: int, floor: float = 0.0
) -> dict[str, Any]:
    """The comparison of one gathering (rank by rank seconds), continuing the count of `previous`; the
    slowest rank is slow when over `factor` times the median and over `floor` seconds."""
    median = statistics.median(seconds)
    slowest = max(range(len(seconds)), key=lambda r: seconds[r])
    ratio = seconds[slowest] / median if median > 0 else 1.0
    slow = ratio > factor and seconds[slowest] > floor
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


def ring_pairs(world_size: int) -> list[tuple[int, int, int]]:
    """The ring's neighbour pairs (r, r+1) with the round each is probed in: within a round no rank is
    in two pairs, so blocking point-to-point exchanges cannot deadlock (two rounds around an even
    ring, three around an odd one). Two ranks are one pair."""
    if world_size < 2:
        return []
    if world_size == 2:
        return [(0, 1, 0)]
    odd = world_size % 2 == 1
    return [(r, (r + 1) % world_size, 2 if odd and r == world_size - 1 else r % 2) for r in range(world_size)]


def link_seconds(fetched_from_left: list[float], fetched_from_right: list[float]) -> list[float]:
    """Each rank's link time from what every rank measured: rank r fetched from its left neighbour in
    `fetched_from_left[r]` seconds and from its right one in `fetched_from_right[r]` (NaN: not
    measured). A rank's link time is the faster of its neighbours' fetches from it."""
    world = len(fetched_from_left)
    times = []
    for rank in range(world):
        of_rank = [fetched_from_right[(rank - 1) % world], fetched_from_left[(rank + 1) % world]]
        measured = [t for t in of_rank if not math.isnan(t)]
        times.append(min(measured) if measured else 0.0)
    return times


def reported(results: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The comparison rank 0 reports: the one that names a straggler, else the one closest to naming
    one; the step times on a tie."""
    return max(results.values(), key=lambda r: (r["straggler"], r["slowChecks"], r["measure"] == STEP))


def _received(tensor: torch.Tensor) -> None:
    """Wait until a receive into `tensor` has landed: on NCCL, recv returns once queued on the stream."""
    if tensor.is_cuda:
        torch.cuda.synchronize(tensor.device)


def _fetch_from(peer: int, token: torch.Tensor, payload: torch.Tensor) -> float:
    """Seconds to fetch `payload` from `peer` (the best of LINK_PROBE_REPEATS); `peer` runs _serve_to."""
    best = float("inf")
    for _ in range(LINK_PROBE_REPEATS):
        dist.send(token, peer)
        dist.recv(token, peer)  # a handshake: both are here, and what the link still held has drained
        _received(token)
        start = time.perf_counter()
        dist.send(token, peer)
        dist.recv(payload, peer)
        _received(payload)
        best = min(best, time.perf_counter() - start)
    return best


def _serve_to(peer: int, token: torch.Tensor, payload: torch.Tensor) -> None:
    """The other side of _fetch_from: answer the handshake, then send `payload` when asked."""
    for _ in range(LINK_PROBE_REPEATS):
        dist.recv(token, peer)
        dist.send(token, peer)
        dist.recv(token, peer)
        dist.send(payload, peer)


def probe_links(rank: int, world_size: int, device: torch.device) -> tuple[float, float]:
    """(seconds to fetch contract.LINK_PROBE_BYTES from the left neighbour, from the right one; NaN where not
    measured), exchanged with both ring neighbours on the default process group. Every rank calls it
    at the same step."""
    token = torch.zeros(1, dtype=torch.float32, device=device)
    payload = torch.zeros(contract.LINK_PROBE_BYTES // 4, dtype=torch.float32, device=device)
    from_left = from_right = float("nan")
    for _, low, high in sorted((round_, low, high) for low, high, round_ in ring_pairs(world_size)):
        if rank == low:  # low fetches from high (its right neighbour), then high from low
            from_right = _fetch_from(high, token, payload)
            _serve_to(high, token, payload)
        elif rank == high:
            _serve_to(low, token, payload)
            from_left = _fetch_from(low, token, payload)
    return from_left, from_right


class _StragglerBehaviour:
    """Probes each rank's link and compares the ranks' step and link times every few steps; reports where
    their step time goes."""

    def __init__(
        self,
        settings: StragglerSettings,
        meter: _StepMeterBehaviour,
        publish: Callable[[dict[str, Any], bool], None],
        publish_breakdown: Callable[[dict[str, Any]], None],
        knobs: Mapping[str, str],
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.meter = meter
        self.publish = publish
        self.publish_breakdown = publish_breakdown
        self.knobs = knobs
        env = os.environ if env is None else env
        self.identity = (env.get(contract.ENV_POD_NAME) or env.get("HOSTNAME") or socket.gethostname(),
                         env.get(contract.ENV_NODE_NAME))
        self.identities: list[Any] = []
        self.latest: dict[str, Any] | None = None
        # The latest comparison of each measure (step, link), whose counts the next one continues.
        self._compared: dict[str, dict[str, Any]] = {}
        self._last_check: int | None = None

    def _comparing(self, trainer: L.Trainer) -> bool:
        return self.settings.every_n_steps > 0 and trainer.world_size > 1 and dist.is_available() and dist.is_initialized()

    def _gathering(self, trainer: L.Trainer) -> bool:
        return trainer.world_size == 1 or (dist.is_available() and dist.is_initialized())

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._last_check = trainer.global_step
        if self._comparing(trainer):
            gathered: list[Any] = [None] * trainer.world_size
            dist.all_gather_object(gathered, self.identity)
            self.identities = gathered

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        every = self.settings.every_n_steps or BREAKDOWN_EVERY_N_STEPS
        if self._gathering(trainer) and step != self._last_check and step % every == 0:
            self._last_check = step
            self._gather(trainer, pl_module, step)

    def _gather(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        totals, steps, micro_batches = self.meter.take(step)
        mine = totals[step_breakdown.FORWARD] / micro_batches if micro_batches else 0.0
        comparing = self._comparing(trainer)
        device = pl_module.device if trainer.world_size > 1 and dist.get_backend() == "nccl" else torch.device("cpu")
        from_left, from_right = (
            probe_links(trainer.global_rank, trainer.world_size, device) if comparing else (math.nan, math.nan)
        )
        local = torch.tensor([mine, from_left, from_right, *step_breakdown.per_step(totals, steps)],
                             dtype=torch.float64, device=device)
        parts = [torch.zeros_like(local) for _ in range(trainer.world_size)]
        if trainer.world_size > 1:
            dist.all_gather(parts, local)
        else:
            parts = [local]
        if not trainer.is_global_zero:
            return
        rows = [[float(x) for x in p.tolist()] for p in parts]
        breakdown = step_breakdown.breakdown(step, [r[3:] for r in rows], self.knobs)
        self.publish_breakdown(breakdown.model_dump(by_alias=True, exclude_none=True, mode="json"))
        if comparing:
            self._compare(rows, step)

    def _compare(self, rows: list[list[float]], step: int) -> None:
        measures = {STEP: ([r[0] for r in rows], 0.0),
                    LINK: (link_seconds([r[1] for r in rows], [r[2] for r in rows]), LINK_SLOW_FLOOR_SECONDS)}
        self._compared = {
            measure: {**compare(seconds, self.settings.factor, self._compared.get(measure), self.settings.window, floor),
                      "measure": measure}
            for measure, (seconds, floor) in measures.items()
        }
        result = reported(self._compared)
        pod, node = (self.identities[result["slowestRank"]] if self.identities else (None, None))
        result = {"step": step, **result, "slowestPod": pod, "slowestNode": node}
        newly = result["straggler"] and not (self.latest or {}).get("straggler")
        cleared = not result["straggler"] and (self.latest or {}).get("straggler")
        self.latest = result
        self.publish(result, bool(newly or cleared))


class StragglerCallback(_StragglerBehaviour, L.Callback):
    __doc__ = _StragglerBehaviour.__doc__


def straggler_callback_class(package: str) -> type:
    """StragglerCallback on `package`'s Callback (lightning.pytorch or pytorch_lightning)."""
    return flavor.callback_class(package, _StragglerBehaviour, StragglerCallback)


def step_measures(package: str, config: TrainerConfig, progress: Any) -> tuple[Any, Any, Any]:
    """The step meter, the straggler comparison and the loader-wait profiler on `package` (lightning.pytorch or
    pytorch_lightning), reporting to `progress` (the progress callback)."""
    meter = step_meter_class(package)()
    knobs = step_breakdown.knobs(config.trainer.num_workers, str(config.trainer.precision))
    straggler = straggler_callback_class(package)(
        config.stragglers, meter, progress.note_step_times, progress.note_step_breakdown, knobs
    )
    return meter, straggler, loader_wait_profiler_class(package)(meter)
