"""Goodput (core/goodput.py): every second of a job in one category, counted by the operator at each reconcile
from the status it reads, and by `dtrain run` from rank 0's records; the categories add up to the wall time."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from dtrain_operator.api import DistributedTrainingStatus, Goodput, Progress, records
from dtrain_operator.core import goodput
from dtrain_operator.core.goodput import instant

T0 = datetime(2026, 12, 6, 12, 0, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def running(stage: str | None = "training", step: int = 10, batch_at: float = 0.0, generation: int = 0,
            restarts: int = 0) -> DistributedTrainingStatus:
    progress = Progress(gang_generation=generation, stage=stage, step=step, batch_time=instant(at(batch_at)))
    return DistributedTrainingStatus(phase="Running", restarts=restarts, progress=progress)


# --- The category of a status -------------------------------------------------------------------------------------

CATEGORIES = [
    ("queued by Kueue", DistributedTrainingStatus(phase="Queued"), None, "queued"),
    ("suspended", DistributedTrainingStatus(phase="Suspended"), None, "queued"),
    ("pods pending", DistributedTrainingStatus(phase="Pending"), None, "starting"),
    ("no phase yet", DistributedTrainingStatus(), None, "starting"),
    ("restarting", DistributedTrainingStatus(phase="Restarting"), None, "restarting"),
    ("running, rank 0 not reported yet", DistributedTrainingStatus(phase="Running"), None, "starting"),
    ("running, the earlier gang's report", running(generation=0, restarts=1), None, "starting"),
    ("training", running(), None, "productive"),
    ("training a step an earlier gang reached", running(step=10), 12, "redone"),
    ("training past it", running(step=13), 12, "productive"),
    ("validating", running("validating"), None, "validating"),
    ("checkpointing", running("checkpointing"), None, "checkpointing"),
    ("exporting", running("exporting"), None, "exporting"),
    ("finishing", running("finishing"), None, "exporting"),
    ("the engine Job", DistributedTrainingStatus(phase="BuildingEngine"), None, "engine"),
    ("succeeded", DistributedTrainingStatus(phase="Succeeded"), None, None),
    ("failed", DistributedTrainingStatus(phase="Failed"), None, None),
]


@pytest.mark.parametrize("case,status,redo_until,expected", CATEGORIES, ids=[c[0] for c in CATEGORIES])
def test_each_state_of_a_job_has_its_category(case, status, redo_until, expected):
    assert goodput.status_category(status, redo_until) == expected


# --- The operator's count, reconcile by reconcile ------------------------------------------------------------------


def test_the_first_count_starts_at_the_jobs_creation():
    counted = goodput.account(None, DistributedTrainingStatus(), DistributedTrainingStatus(phase="Pending"), at(3), T0)
    assert counted.seconds == {"starting": 3.0}
    assert counted.current == "starting" and counted.accounted_at == instant(at(3))


def test_time_counts_in_the_category_of_the_earlier_reconcile_and_adds_up():
    so_far = Goodput(seconds={"starting": 20.0}, current="productive", accounted_at=instant(at(20)))
    # The reconcile at 30 s reads rank 0's report that it is checkpointing (batches completed until 29 s).
    read = running("checkpointing", batch_at=29)
    counted = goodput.account(so_far, read, read, at(30), T0)
    assert counted.seconds == {"starting": 20.0, "productive": 10.0}
    assert counted.current == "checkpointing" and counted.ratio == pytest.approx(10 / 30, abs=1e-3)


def test_a_gang_that_completes_no_batch_is_stalled_from_a_minute_after_its_last_one():
    so_far = Goodput(seconds={"productive": 100.0}, current="productive", accounted_at=instant(at(100)))
    read = running(batch_at=95)
    restarted = DistributedTrainingStatus(phase="Restarting", restarts=1)
    counted = goodput.account(so_far, read, restarted, at(300), T0)  # the progress deadline restarts it at 300 s
    assert counted.seconds == {"productive": 155.0, "stalled": 145.0}
    assert counted.current == "restarting"


def test_after_a_restart_the_steps_an_earlier_gang_reached_are_redone():
    so_far = Goodput(seconds={"productive": 50.0}, current="productive", accounted_at=instant(at(50)),
                     highest_step=40)
    read = running(step=45, batch_at=55)
    counted = goodput.account(so_far, read, DistributedTrainingStatus(phase="Restarting", restarts=1), at(55), T0)
    assert counted.redo_until == 45
    # The new gang resumed from step 30: until it passes 45, its training is done again.
    new_gang = running(step=35, batch_at=80, generation=1, restarts=1)
    again = goodput.account(counted, new_gang, new_gang, at(80), T0)
    assert again.current == "redone"
    later = goodput.account(again, running(step=46, batch_at=90, generation=1, restarts=1),
                            running(step=46, batch_at=90, generation=1, restarts=1), at(90), T0)
    assert later.seconds["redone"] == 10.0 and later.current == "productive"


def test_nothing_is_counted_once_the_job_finished():
    so_far = Goodput(seconds={"productive": 50.0}, current="exporting", accounted_at=instant(at(50)))
    done = DistributedTrainingStatus(phase="Succeeded")
    final = goodput.account(so_far, running("finishing", batch_at=49), done, at(52), T0)
    assert final.seconds == {"productive": 50.0, "exporting": 2.0} and final.current is None
    assert goodput.account(final, done, done, at(500), T0).seconds == final.seconds


def test_the_count_is_written_on_its_own_only_when_the_status_lags_five_minutes():
    written = Goodput(current="productive", accounted_at=instant(at(0)))
    assert not goodput.worth_a_write(written, written.model_copy(update={"accounted_at": instant(at(299))}))
    assert goodput.worth_a_write(written, written.model_copy(update={"accounted_at": instant(at(300))}))
    assert goodput.worth_a_write(None, written)


def test_the_later_of_the_written_and_the_kept_count_is_taken():
    written = Goodput(accounted_at=instant(at(10)))
    kept = Goodput(accounted_at=instant(at(20)))
    assert goodput.latest(written, kept) is kept and goodput.latest(kept, written) is kept
    assert goodput.latest(None, kept) is kept and goodput.latest(written, None) is written


# --- `dtrain run`: from rank 0's records ------------------------------------------------------------------------------


def _record(record: records.TrainerRecord, second: float) -> dict:
    return record.model_copy(update={"time": instant(at(second))}).to_wire()


def test_a_run_with_a_restart_and_a_hang_is_counted_from_its_records_and_adds_up_to_its_wall_time():
    progress = records.ProgressRecord
    run = [
        _record(records.StartRecord(), 5),  # 0-5: starting (processes launched, imports)
        _record(records.PreflightRecord(), 8),
        _record(progress(stage="training", step=1), 10),  # 5-10: starting
        _record(progress(stage="training", step=20), 30),  # 10-30: productive
        _record(progress(stage="checkpointing", step=20), 31),  # 30-31: productive
        _record(records.CheckpointRecord(step=20, ok=True), 33),  # 31-33: checkpointing
        _record(progress(stage="training", step=30), 40),  # 33-40: productive (the checkpoint written)
        _record(records.HangRecord(step=30, stalled_seconds=50), 100),  # 40-50: productive, 50-100: stalled
        _record(records.StartRecord(), 110),  # 100-110: restarting
        _record(progress(stage="training", step=25), 115),  # 110-115: starting
        _record(progress(stage="training", step=31), 125),  # 115-125: redone (up to step 30 again)
        _record(progress(stage="exporting", step=40), 135),  # 125-135: productive
        _record(records.ExportRecord(ok=True), 137),  # 135-137: exporting
        _record(records.FinishedRecord(ok=True, step=40), 138),  # 137-138: exporting; then the engine until 150
    ]
    counted = goodput.from_records(run, T0, at(150), engine=True)
    assert counted["seconds"] == {"starting": 15.0, "productive": 48.0, "checkpointing": 2.0, "stalled": 50.0,
                                  "restarting": 10.0, "redone": 10.0, "exporting": 3.0, "engine": 12.0}
    assert sum(counted["seconds"].values()) == 150.0 and counted["ratio"] == 0.32


def test_a_run_without_records_was_starting_all_along():
    assert goodput.from_records([], T0, at(7), engine=False) == {"ratio": 0.0, "seconds": {"starting": 7.0}}
