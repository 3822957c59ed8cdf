"""Where each rank's step time goes, and the one line that names the bottleneck (dtrain_trainer.step_breakdown)."""

from __future__ import annotations

import pytest

from dtrain_operator.api.records import ProgressRecord, checked_record, status_patch
from dtrain_operator.api.status import MAX_BREAKDOWN_RANKS
from dtrain_trainer.step_breakdown import bottleneck_line, breakdown, knobs, per_step, rank_row, reported_ranks

KNOBS = knobs(num_workers=0, precision="32-true")


def rows(*seconds: tuple[float, float, float, float, float]) -> list:
    """Rank r's row from the r-th tuple: (dataWait, forward, backward, allReduce, optimizer) seconds per step."""
    return [rank_row(rank, row) for rank, row in enumerate(seconds)]


@pytest.mark.parametrize(("seconds", "line"), [
    # A slow loader on rank 1: the other rank waits for it in the all-reduce, which names nothing.
    ([(0.0, 0.1, 0.2, 0.41, 0.01), (0.41, 0.1, 0.2, 0.01, 0.01)],
     "rank 1: 56 % of its step waits on the data loader; trainer.numWorkers 0"),
    # Compute-bound everywhere: the slowest rank's largest part.
    ([(0.01, 0.1, 0.2, 0.02, 0.01), (0.01, 0.1, 0.25, 0.0, 0.01)],
     "rank 1: 68 % of its step is the backward pass; trainer.precision 32-true"),
    ([(0.0, 0.3, 0.1, 0.0, 0.0), (0.0, 0.1, 0.1, 0.2, 0.0)],
     "rank 0: 75 % of its step is the forward pass and loss; trainer.precision 32-true"),
    # Even the slowest rank waits mostly in the all-reduce: the network or the gradients' size.
    ([(0.0, 0.05, 0.05, 0.5, 0.01), (0.0, 0.05, 0.06, 0.49, 0.01)],
     ("rank 1: 80 % of its step waits in DDP's gradient all-reduce and buffer broadcast; the network between the "
      "ranks (spec.nccl; stepTimes with measure link) or the gradients' size")),
    # No knob for the optimizer step.
    ([(0.0, 0.01, 0.01, 0.0, 0.3)], "rank 0: 94 % of its step is the optimizer step"),
    # Equal ranks: the lowest is named.
    ([(0.2, 0.1, 0.1, 0.0, 0.0), (0.2, 0.1, 0.1, 0.0, 0.0)],
     "rank 0: 50 % of its step waits on the data loader; trainer.numWorkers 0"),
], ids=["slow loader", "backward", "forward", "all-reduce", "optimizer", "a tie"])
def test_the_bottleneck_is_the_slowest_ranks_largest_part(seconds, line) -> None:
    assert bottleneck_line(rows(*seconds), KNOBS) == line


def test_nothing_measured_names_no_bottleneck() -> None:
    assert bottleneck_line([], KNOBS) is None
    assert bottleneck_line(rows((0.0, 0.0, 0.0, 0.0, 0.0)), KNOBS) is None


def test_the_means_are_per_optimizer_step() -> None:
    totals = {"dataWait": 1.0, "forward": 2.0, "backward": 4.0, "allReduce": 0.5, "optimizer": 0.25}
    assert per_step(totals, 4) == [0.25, 0.5, 1.0, 0.125, 0.0625]
    assert per_step(totals, 0) == [0.0] * 5  # no optimizer step in the window


def test_a_large_gang_reports_its_slowest_ranks_and_the_median_one() -> None:
    gang = rows(*[(0.01 * rank, 0.1, 0.1, 0.0, 0.0) for rank in range(256)])
    reported = reported_ranks(gang)
    assert len(reported) == MAX_BREAKDOWN_RANKS
    assert [row.rank for row in reported] == [255, 254, 253, 127]
    assert [row.rank for row in reported_ranks(gang[:3])] == [2, 1, 0]


def test_what_rank_zero_reports_goes_into_the_status_as_sent() -> None:
    reported = breakdown(8, [[0.0, 0.1, 0.2, 0.4, 0.0], [0.4, 0.1, 0.2, 0.0, 0.0]], KNOBS)
    assert (reported.step, reported.world_size, [row.rank for row in reported.ranks or []]) == (8, 2, [1, 0])
    wire = reported.model_dump(by_alias=True, exclude_none=True, mode="json")
    record = ProgressRecord(time="2026-01-01T00:00:00Z", step=8, step_breakdown=wire).to_wire()
    patch = status_patch(record)
    assert patch is not None and patch["progress"]["stepBreakdown"] == wire
    assert wire["ranks"][0] == {"rank": 1, "dataWait": 0.4, "forward": 0.1, "backward": 0.2, "allReduce": 0.0, "optimizer": 0.0}


@pytest.mark.parametrize("breakdown_sent", [
    {"ranks": [{"rank": r} for r in range(MAX_BREAKDOWN_RANKS + 1)]},
    {"bottleneck": "x" * 1000},
    {"bottleneck": "rank 1:\x1b[2J waits"},
], ids=["too many ranks", "a huge line", "an escape in the line"])
def test_a_breakdown_over_its_bounds_is_refused(breakdown_sent) -> None:
    with pytest.raises(ValueError, match="stepBreakdown"):
        checked_record({"event": "progress", "time": "2026-01-01T00:00:00Z", "stepBreakdown": breakdown_sent})
