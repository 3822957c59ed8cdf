"""Straggler comparison (trainer) and its condition message (operator and `dtrain run`)."""

from __future__ import annotations

from dtrain_operator.api import StepTimes, StragglerSettings
from dtrain_operator.core.stragglers import straggler_message
from dtrain_trainer.stragglers import compare


def test_the_slowest_rank_against_the_median_in_a_row() -> None:
    first = compare([0.1, 0.31, 0.1, 0.11], factor=1.5, previous=None, window=3)
    assert (first["slowestRank"], first["slowChecks"], first["straggler"]) == (1, 1, False)
    assert first["medianSeconds"] == 0.105 and first["ratio"] == round(0.31 / 0.105, 3)
    second = compare([0.1, 0.3, 0.1, 0.1], 1.5, first, 3)
    third = compare([0.1, 0.3, 0.1, 0.1], 1.5, second, 3)
    assert (third["slowChecks"], third["straggler"]) == (3, True)
    # Another rank slow, or none: the count starts again.
    assert compare([0.3, 0.1, 0.1, 0.1], 1.5, third, 3)["slowChecks"] == 1
    assert compare([0.1, 0.12, 0.1, 0.1], 1.5, third, 3) | {} == {
        **compare([0.1, 0.12, 0.1, 0.1], 1.5, None, 3)
    }
    assert not compare([0.1, 0.12, 0.1, 0.1], 1.5, third, 3)["straggler"]


def test_the_message_names_pod_and_node_and_stays_the_same_while_the_rank_is_slow() -> None:
    settings = StragglerSettings(factor=1.5, window=3)
    times = StepTimes(step=150, slowest_rank=1, slowest_pod="job-1", slowest_node="node-b", ratio=3.1, straggler=True)
    message = straggler_message(times, settings)
    assert message is not None
    assert message.startswith("rank 1 (pod job-1 on node node-b) is a straggler")
    assert "1.5 x the median" in message and "3 comparisons" in message
    later = times.model_copy(update={"step": 200, "ratio": 2.9})
    assert straggler_message(later, settings) == message
    assert straggler_message(times.model_copy(update={"straggler": False}), settings) is None
    assert straggler_message(None, settings) is None
