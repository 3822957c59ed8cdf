"""Where each rank's step time goes, and the bottleneck that names: pure functions over what the ranks measured.

Each rank measures, over the window between two comparisons (dtrain_trainer.step_meter), the
seconds it spent in five parts of its optimizer steps; rank 0 gathers them with the straggler
comparison (dtrain_trainer.stragglers) and reports status.progress.stepBreakdown: the slowest
ranks and the median one, and one line that names the bottleneck, e.g.

    rank 1: 41 % of its step waits on the data loader; trainer.numWorkers 0

The bottleneck is looked for on the slowest rank, by its time outside the all-reduce: in DDP
every rank waits in the gradient all-reduce for the slowest, so a rank whose data loader is slow
shows it as data wait, and every other rank shows the same time as all-reduce. Only when the
slowest rank itself waits mostly in the all-reduce is the all-reduce (the network, the gradients'
size) the bottleneck.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dtrain_operator.api import RankStepBreakdown, StepBreakdown
from dtrain_operator.api.status import MAX_BREAKDOWN_RANKS

DATA_WAIT, FORWARD, BACKWARD, ALL_REDUCE, OPTIMIZER = "dataWait", "forward", "backward", "allReduce", "optimizer"
# The order the parts of a step are gathered in (a rank's row of floats) and reported.
CATEGORIES = (DATA_WAIT, FORWARD, BACKWARD, ALL_REDUCE, OPTIMIZER)
# What a share of the step is spent on, as the bottleneck line says it.
DOING = {
    DATA_WAIT: "waits on the data loader",
    FORWARD: "is the forward pass and loss",
    BACKWARD: "is the backward pass",
    ALL_REDUCE: "waits in DDP's gradient all-reduce and buffer broadcast",
    OPTIMIZER: "is the optimizer step",
}


def per_step(totals: Mapping[str, float], optimizer_steps: int) -> list[float]:
    """Mean seconds per optimizer step of each category (CATEGORIES' order) from the window's totals."""
    return [totals.get(category, 0.0) / optimizer_steps if optimizer_steps > 0 else 0.0 for category in CATEGORIES]


def rank_row(rank: int, seconds: Sequence[float]) -> RankStepBreakdown:
    """One rank's breakdown from its seconds per step in CATEGORIES' order."""
    return RankStepBreakdown.model_validate({"rank": rank, **{c: round(s, 6) for c, s in zip(CATEGORIES, seconds)}})


def seconds_of(row: RankStepBreakdown) -> dict[str, float]:
    """The row's seconds per step by category (a category not measured: 0)."""
    wire = row.model_dump(by_alias=True)
    return {category: float(wire.get(category) or 0.0) for category in CATEGORIES}


def own_seconds(row: RankStepBreakdown) -> float:
    """A rank's time outside the all-reduce: what it spends itself, not waiting for the others."""
    return sum(s for category, s in seconds_of(row).items() if category != ALL_REDUCE)


def reported_ranks(rows: Sequence[RankStepBreakdown]) -> list[RankStepBreakdown]:
    """The slowest ranks (by own_seconds), slowest first, then the median rank: at most MAX_BREAKDOWN_RANKS rows."""
    by_own = sorted(rows, key=lambda row: (-own_seconds(row), row.rank or 0))
    if len(by_own) <= MAX_BREAKDOWN_RANKS:
        return by_own
    median = by_own[len(by_own) // 2]
    return [*by_own[: MAX_BREAKDOWN_RANKS - 1], median]


def bottleneck_line(rows: Sequence[RankStepBreakdown], knobs: Mapping[str, str]) -> str | None:
    """The bottleneck in one line: the slowest rank's (by own_seconds) largest share of its step, and the knob
    that acts on it where `knobs` names one (by category); None when nothing was measured."""
    if not rows:
        return None
    slowest = min(rows, key=lambda row: (-own_seconds(row), row.rank or 0))
    seconds = seconds_of(slowest)
    total = sum(seconds.values())
    if total <= 0:
        return None
    category = max(CATEGORIES, key=lambda c: seconds[c])
    knob = knobs.get(category)
    line = f"rank {slowest.rank}: {100 * seconds[category] / total:.0f} % of its step {DOING[category]}"
    return f"{line}; {knob}" if knob else line


def breakdown(step: int, rows: Sequence[Sequence[float]], knobs: Mapping[str, str]) -> StepBreakdown:
    """What rank 0 reports from every rank's seconds per step (row r is rank r's, in CATEGORIES' order)."""
    ranked = [rank_row(rank, seconds) for rank, seconds in enumerate(rows)]
    return StepBreakdown(step=step, world_size=len(ranked), ranks=reported_ranks(ranked),
                         bottleneck=bottleneck_line(ranked, knobs))


def knobs(num_workers: int, precision: str) -> dict[str, str]:
    """The spec's fields that act on each part of a step, with their values, as the bottleneck line names them."""
    compute = f"trainer.precision {precision}"
    return {
        DATA_WAIT: f"trainer.numWorkers {num_workers}",
        FORWARD: compute,
        BACKWARD: compute,
        ALL_REDUCE: "the network between the ranks (spec.nccl; stepTimes with measure link) or the gradients' size",
    }
