"""Straggler comparison (trainer) and its condition message (operator and `dtrain run`)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from dtrain_operator.api import StepTimes, StragglerSettings
from dtrain_operator.core.stragglers import place_in_gang, straggler_message
from dtrain_trainer.stragglers import LINK, LINK_SLOW_FLOOR_SECONDS, STEP, compare, link_seconds, reported, ring_pairs
from tests.builders import a_worker

NAN = float("nan")


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


GANG = {rank: replace(a_worker(rank), node=f"node-{'ab'[rank]}") for rank in range(2)}
PLACE = place_in_gang(GANG, devices_per_node=2)


def test_the_message_names_pod_and_node_and_stays_the_same_while_the_rank_is_slow() -> None:
    """The pod and node are the operator's view of the rank (its node rank's pod), whatever rank 0 reported."""
    settings = StragglerSettings(factor=1.5, window=3)
    times = StepTimes(step=150, slowest_rank=3, slowest_pod="victim", slowest_node="node-z", ratio=3.1, straggler=True)
    message = straggler_message(times, settings, PLACE)
    assert message is not None
    assert message.startswith(f"rank 3 (pod {GANG[1].name} on node node-b) is a straggler")
    assert "victim" not in message and "node-z" not in message
    assert "1.5 x the median" in message and "3 comparisons" in message
    later = times.model_copy(update={"step": 200, "ratio": 2.9})
    assert straggler_message(later, settings, PLACE) == message
    assert straggler_message(times.model_copy(update={"straggler": False}), settings, PLACE) is None
    assert straggler_message(None, settings, PLACE) is None
    beyond = straggler_message(times.model_copy(update={"slowest_rank": 99}), settings, PLACE)
    assert beyond is not None and beyond.startswith("rank 99 (no pod of the current gang)")


def test_a_slow_time_under_the_floor_is_not_slow() -> None:
    noisy = [0.0005, 0.0019, 0.0004]  # sub-millisecond link times: the scheduler's, not the link's
    assert compare(noisy, 1.5, None, 1, floor=LINK_SLOW_FLOOR_SECONDS)["slowChecks"] == 0
    assert compare([0.005, 0.068, 0.006], 1.5, None, 1, floor=LINK_SLOW_FLOOR_SECONDS)["straggler"]


@pytest.mark.parametrize("world", range(2, 10))
def test_ring_pairs_cover_the_ring_and_no_rank_is_in_two_pairs_of_a_round(world: int) -> None:
    pairs = ring_pairs(world)
    edges = {frozenset((low, high)) for low, high, _ in pairs}
    assert edges == {frozenset((r, (r + 1) % world)) for r in range(world)}
    assert len(pairs) == len(edges)
    for _, in_round in itertools.groupby(sorted(pairs, key=lambda p: p[2]), key=lambda p: p[2]):
        ranks = [rank for low, high, _ in in_round for rank in (low, high)]
        assert len(ranks) == len(set(ranks))
    assert {round_ for _, _, round_ in pairs} <= {0, 1, 2}


def test_only_a_rank_slow_to_send_to_both_neighbours_has_a_slow_link() -> None:
    # Rank r fetched from r-1 in from_left[r] seconds and from r+1 in from_right[r]. Rank 1 sends slowly:
    # rank 0's fetch from its right (1) and rank 2's from its left (1) are slow.
    from_left = [0.005, 0.005, 0.070, 0.005]
    from_right = [0.070, 0.005, 0.005, 0.005]
    assert link_seconds(from_left, from_right) == [0.005, 0.070, 0.005, 0.005]
    # Rank 1's link slow both ways: its own fetches are slow too, but each of its neighbours has one fast
    # neighbour, so only rank 1 is slow.
    from_left[1] = from_right[1] = 0.070
    assert link_seconds(from_left, from_right) == [0.005, 0.070, 0.005, 0.005]


def test_two_ranks_name_the_one_that_sends_slowly() -> None:
    # One pair: rank 0 fetched from rank 1 (its right), rank 1 from rank 0 (its left).
    assert link_seconds([NAN, 0.004], [0.080, NAN]) == [0.004, 0.080]


def test_the_report_is_the_comparison_that_names_a_straggler() -> None:
    step = {**compare([0.1, 0.1, 0.1], 1.5, None, 2), "measure": STEP}
    link = {**compare([0.005, 0.07, 0.005], 1.5, None, 1, LINK_SLOW_FLOOR_SECONDS), "measure": LINK}
    assert reported({STEP: step, LINK: link}) is link
    slow_step = {**compare([0.1, 0.3, 0.1], 1.5, None, 1), "measure": STEP}
    assert reported({STEP: slow_step, LINK: link}) is slow_step
    quiet = {**compare([0.005, 0.005, 0.005], 1.5, None, 1, LINK_SLOW_FLOOR_SECONDS), "measure": LINK}
    assert reported({STEP: step, LINK: quiet}) is step


def test_a_link_straggler_message_says_it_is_the_link() -> None:
    settings = StragglerSettings(factor=1.5, window=3)
    times = StepTimes(step=12, measure="link", slowest_rank=1, slowest_pod="job-1", slowest_node="node-b", straggler=True)
    message = straggler_message(times, settings, PLACE)
    assert message is not None and message.startswith(f"rank 1 (pod {GANG[0].name} on node node-a) is a straggler: its link time")
    assert "8 MiB" in message and "network interface" in message
