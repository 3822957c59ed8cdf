"""How a gang restart is recorded in the status: the count it adds to, in place or by recreating the pods
(core.in_place decides), status.lastRestart, and the Restarting condition that says both."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from dtrain_operator.api import DistributedTraining, DistributedTrainingStatus, LastRestart
from dtrain_operator.api.failure_rules import STRATEGY_IN_PLACE, STRATEGY_RECREATE, RestartStrategy
from dtrain_operator.core import in_place
from dtrain_operator.core.observation import PodObservation, format_time
from dtrain_operator.core.policy import FailureDecision
from dtrain_operator.core.status.conditions import (
    PODS_PENDING,
    REASON_GANG_RESTARTING,
    RESTARTING,
    RUNNING,
    Conditions,
)

# How a restart is made, in the words of the Restarting condition and of the strategy's own Event.
HOW: dict[str, str] = {STRATEGY_IN_PLACE: "in place, in the same pods", STRATEGY_RECREATE: "by recreating its pods"}


def _how(strategy: RestartStrategy, why: str) -> str:
    return f"{HOW[strategy]} ({why})"


def record_restart(
    status: DistributedTrainingStatus,
    conditions: Conditions,
    decision: FailureDecision,
    how: tuple[RestartStrategy, str],
    hung: bool,
    now: datetime,
) -> None:
    """A new gang generation: counted as the decision says, in place or not (`how`: the strategy and why);
    `hung`: the progress deadline decided, not a worker's failure."""
    strategy, why = how
    if decision.count == "evictions":
        status.evictions += 1
    elif decision.count == "restartsIgnoringBackoff":
        status.restarts_ignoring_backoff += 1
    else:
        status.restarts += 1
    in_place_now = strategy == STRATEGY_IN_PLACE
    status.restarts_in_place += in_place_now
    status.in_place_generation = status.gang_generation if in_place_now else None
    status.last_restart = LastRestart(generation=status.gang_generation, strategy=strategy, why=why, time=format_time(now))
    status.phase = "Restarting"
    conditions.set(RESTARTING, True, decision.reason, f"{decision.message}; {_how(strategy, why)}")
    cause = (": it made no progress within runPolicy.progressDeadlineSeconds" if hung
             else ": Kueue evicted it" if decision.count == "evictions" else " after a worker failed")
    conditions.set(RUNNING, False, REASON_GANG_RESTARTING, f"the gang is restarting{cause}")
    conditions.clear(PODS_PENDING, REASON_GANG_RESTARTING, "the gang is restarting")


def await_in_place(
    job: DistributedTraining,
    status: DistributedTrainingStatus,
    conditions: Conditions,
    workers: Sequence[PodObservation],
    now: datetime,
) -> None:
    """An in-place restart under way goes on (Restarting), or cannot finish (core.in_place.gives_up): the same
    generation, by recreating its pods, counted once."""
    status.phase = "Restarting"
    problem = in_place.gives_up(job, status, workers, now)
    if problem is None:
        return
    status.in_place_generation = None
    status.restarts_in_place -= 1
    status.last_restart = LastRestart(
        generation=status.gang_generation,
        strategy=STRATEGY_RECREATE,
        why=f"the restart in place could not finish: {problem}",
        time=format_time(now),
    )
    restarting = conditions.get(RESTARTING)
    if restarting is not None:
        conditions.set(RESTARTING, True, restarting.reason, f"{restarting.message}; then {problem}: recreating its pods")
