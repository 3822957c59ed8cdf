"""The progress deadline: one pure decision, shared by the operator and `dtrain run`."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from dtrain_operator.api import DistributedTrainingSpec, Progress, RunPolicy, contract
from dtrain_operator.core.progress_deadline import (
    REASON_PROGRESS_DEADLINE,
    ProgressWatch,
    decide,
    mark_of,
    observe,
    progress_from_record,
    wake_after,
)

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def progress(batches: int, stage: str = contract.PROGRESS_STAGE_TRAINING, step: int = 10) -> Progress:
    return Progress(step=step, batches=batches, batch_time=f"2026-01-01T00:00:{batches % 60:02d}Z", stage=stage)


def started(batches: int, now: datetime, generation: int = 0) -> ProgressWatch:
    """The watch on a gang that has just reported its first batch."""
    watch = observe(observe(None, generation, True, None, now), generation, True, progress(batches), now)
    assert watch is not None and watch.started
    return watch


def test_on_by_default_well_under_the_collective_timeout():
    spec = DistributedTrainingSpec()
    assert spec.run_policy.progress_deadline_seconds == contract.DEFAULT_PROGRESS_DEADLINE_SECONDS == 600
    assert spec.run_policy.progress_deadline_seconds < spec.nccl.timeout_seconds


def test_a_gang_that_advances_is_never_restarted():
    policy = RunPolicy(progress_deadline_seconds=60)
    watch = started(0, at(0))
    for t in range(0, 600, 15):
        watch = observe(watch, 0, True, progress(t), at(t))
        assert decide(policy, watch, at(t + 14), restarts=0) is None


def test_no_batch_for_longer_than_the_deadline_restarts_the_gang():
    policy = RunPolicy(progress_deadline_seconds=60, backoff_limit=3)
    watch = started(5, at(0))
    for t in (15, 30, 45, 60):
        # The reporter may send the same counter again (a heartbeat): it is no progress.
        watch = observe(watch, 0, True, progress(5), at(t))
    assert decide(policy, watch, at(60), restarts=0) is None
    decision = decide(policy, watch, at(61), restarts=1)
    assert decision is not None and decision.restart
    assert decision.reason == REASON_PROGRESS_DEADLINE
    assert "61 s" in decision.message and "at step 10" in decision.message and "(2/3)" in decision.message
    assert wake_after(policy, watch, at(30)) == pytest.approx(30.1)


def test_counted_against_the_backoff_limit_and_final_under_never():
    watch = started(5, at(0))
    limited = decide(RunPolicy(progress_deadline_seconds=30, backoff_limit=2), watch, at(31), restarts=2)
    assert limited is not None and not limited.restart and limited.reason == "BackoffLimitExceeded"
    never = decide(RunPolicy(progress_deadline_seconds=30, restart_policy="Never"), watch, at(31), restarts=0)
    assert never is not None and not never.restart and never.reason == REASON_PROGRESS_DEADLINE


@pytest.mark.parametrize("seconds", [1, 14, contract.MIN_PROGRESS_DEADLINE_SECONDS - 1])
def test_a_deadline_that_runs_out_between_a_healthy_gangs_reports_is_refused(seconds: int):
    """Rank 0 reports every 15 s: a shorter deadline would restart every healthy gang until BackoffLimitExceeded."""
    with pytest.raises(ValueError, match=f"under {contract.MIN_PROGRESS_DEADLINE_SECONDS} s, twice how often rank 0"):
        DistributedTrainingSpec.model_validate({"runPolicy": {"progressDeadlineSeconds": seconds}})
    assert contract.MIN_PROGRESS_DEADLINE_SECONDS >= 2 * contract.DEFAULT_PROGRESS_INTERVAL_SECONDS
    assert RunPolicy(progress_deadline_seconds=contract.MIN_PROGRESS_DEADLINE_SECONDS).progress_deadline_seconds == 30
    described = str(RunPolicy.model_fields["progress_deadline_seconds"].description)
    assert f"at least {contract.MIN_PROGRESS_DEADLINE_SECONDS} " in described


def test_zero_turns_it_off():
    watch = started(5, at(0))
    assert decide(RunPolicy(progress_deadline_seconds=0), watch, at(10**6), restarts=0) is None
    assert wake_after(RunPolicy(progress_deadline_seconds=0), watch, at(0)) is None


@pytest.mark.parametrize(
    "stage",
    [contract.PROGRESS_STAGE_CHECKPOINTING, contract.PROGRESS_STAGE_EXPORTING, contract.PROGRESS_STAGE_FINISHING],
)
def test_checkpointing_exporting_and_finishing_hold_the_clock(stage: str):
    policy = RunPolicy(progress_deadline_seconds=60)
    watch = started(5, at(0))
    watch = observe(watch, 0, True, progress(5, stage), at(50))
    for t in range(50, 1000, 30):  # a checkpoint that takes 15 minutes to write
        watch = observe(watch, 0, True, progress(5, stage), at(t))
        assert decide(policy, watch, at(t + 29), restarts=0) is None
    assert wake_after(policy, watch, at(1000)) == pytest.approx(policy.stage_deadline_seconds - 950 + 0.1)
    # Back to training: the clock starts from the end of the save, not from the last batch.
    watch = observe(watch, 0, True, progress(5), at(1000))
    assert decide(policy, watch, at(1059), restarts=0) is None
    assert decide(policy, watch, at(1061), restarts=0) is not None


@pytest.mark.parametrize(
    "stage",
    [contract.PROGRESS_STAGE_CHECKPOINTING, contract.PROGRESS_STAGE_EXPORTING, contract.PROGRESS_STAGE_FINISHING],
)
def test_no_stage_holds_the_clock_for_ever(stage: str):
    """A rank 0 that stays exporting (a finished gang whose ranks never end, a stuck write) is handled as a hang
    once runPolicy.stageDeadlineSeconds passed from when it entered the stage, however often it reports it."""
    policy = RunPolicy(progress_deadline_seconds=60, stage_deadline_seconds=900)
    watch = started(5, at(0))
    for t in range(50, 950, 15):
        watch = observe(watch, 0, True, progress(5, stage), at(t))
        assert decide(policy, watch, at(t), restarts=0) is None
    assert wake_after(policy, watch, at(935)) == pytest.approx(15.1)
    decision = decide(policy, watch, at(951), restarts=0)
    assert decision is not None and decision.restart and decision.reason == REASON_PROGRESS_DEADLINE
    assert decision.message.startswith(f"rank 0 has been {stage} for 901 s (at step 10)")
    assert "runPolicy.stageDeadlineSeconds is 900" in decision.message
    unbounded = RunPolicy(progress_deadline_seconds=60, stage_deadline_seconds=0)
    assert decide(unbounded, watch, at(10_000), restarts=0) is None and wake_after(unbounded, watch, at(10_000)) is None
    # Another stage starts its own clock.
    other = contract.PROGRESS_STAGE_FINISHING if stage != contract.PROGRESS_STAGE_FINISHING else contract.PROGRESS_STAGE_EXPORTING
    watch = observe(watch, 0, True, progress(5, other), at(960))
    assert decide(policy, watch, at(1800), restarts=0) is None


def test_validation_batches_are_progress():
    policy = RunPolicy(progress_deadline_seconds=60)
    watch = started(5, at(0))
    for t in range(15, 600, 15):
        watch = observe(watch, 0, True, progress(5 + t, contract.PROGRESS_STAGE_VALIDATING), at(t))
        assert decide(policy, watch, at(t + 14), restarts=0) is None


def test_the_clock_runs_only_while_every_worker_runs_and_restarts_with_each_gang():
    policy = RunPolicy(progress_deadline_seconds=60)
    assert observe(None, 0, False, progress(5), at(0)) is None
    assert decide(policy, None, at(10**6), restarts=0) is None
    old = started(5, at(0))
    # The restarted gang shows the old gang's last report until it reports itself: its start
    # (imports, data, the model, loading the checkpoint) takes what it takes.
    new = observe(old, 1, True, progress(5), at(500))
    assert new is not None and new.generation == 1 and not new.started
    new = observe(new, 1, True, progress(5), at(2000))
    assert decide(policy, new, at(5000), restarts=1) is None
    assert wake_after(policy, new, at(5000)) is None
    new = observe(new, 1, True, progress(1), at(2100))
    assert new is not None and new.started and new.since == at(2100)
    assert decide(policy, new, at(2159), restarts=1) is None
    assert decide(policy, new, at(2161), restarts=1) is not None


def test_a_failover_neither_fires_early_nor_never():
    """A new leader has no watch of its own: one that finds this gang's own report (stamped with its
    generation by the operator that took it) watches at once, from the takeover; a report of an
    older gang still waits for the gang's first one."""
    policy = RunPolicy(progress_deadline_seconds=60)
    own = progress(5).model_copy(update={"gang_generation": 2})
    # The gang hung long before the failover: the new leader's clock starts at the takeover.
    watch = observe(None, 2, True, own, at(1000))
    assert watch is not None and watch.started and watch.since == at(1000)
    assert decide(policy, watch, at(1059), restarts=2) is None
    assert decide(policy, observe(watch, 2, True, own, at(1061)), at(1061), restarts=2) is not None
    older = progress(5).model_copy(update={"gang_generation": 1})
    waiting = observe(None, 2, True, older, at(1000))
    assert waiting is not None and not waiting.started
    assert decide(policy, waiting, at(10**6), restarts=2) is None


def test_a_trainer_without_a_batch_counter_is_watched_by_its_step():
    assert mark_of(Progress(epoch=1, step=7)) == ("step", 1, 7)
    assert mark_of(None) == ()
    record = {"event": "progress", "step": 3, "epoch": 0, "batches": 9, "batchTime": "t", "stage": "training"}
    parsed = progress_from_record(record)
    assert parsed is not None and mark_of(parsed) == ("batches", 9, "t")


def test_the_watch_is_a_value():
    watch = ProgressWatch(0, ("batches", 1, "t"), T0, started=True)
    assert observe(watch, 0, True, Progress(batches=1, batch_time="t"), at(30)) is watch
