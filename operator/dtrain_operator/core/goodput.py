"""Goodput: where a job's wall time went, by category, and the share of it that trained something new.

One set of categories for the operator (status.goodput, accounted at each reconcile from the status it
reads: `account`) and for `dtrain run` (summary.json's goodput, from rank 0's records afterwards:
`from_records`). Every second of the job falls in exactly one category, so they add up to its wall time:

- productive: training steps no earlier gang of the job had reached;
- redone: training steps an earlier gang had reached and lost (work done again after a restart);
- queued: waiting for Kueue's admission, or suspended;
- starting: pods pending and starting, then each gang's processes before their first training batch
  (imports, rendezvous, pre-flight, checkpoint load);
- validating, checkpointing: rank 0's stages;
- stalled: a gang that completed no batch for STALL_SECONDS, until it is restarted;
- restarting: from a failure to the next gang's start;
- exporting: the ONNX export and the processes' end after training;
- engine: the engine Job (`dtrain run`: the engine build).

The operator counts at the granularity of its reconciles (each report of rank 0 brings one); between two,
time counts in the category the job was in at the earlier one, but for a gang that completed no batch
since: from STALL_SECONDS after its last batch, that time is stalled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Final

from dtrain_operator.api import DistributedTrainingStatus, Goodput, contract, records
from dtrain_operator.core.observation import parse_time

PRODUCTIVE: Final = "productive"
REDONE: Final = "redone"
QUEUED: Final = "queued"
STARTING: Final = "starting"
VALIDATING: Final = "validating"
CHECKPOINTING: Final = "checkpointing"
STALLED: Final = "stalled"
RESTARTING: Final = "restarting"
EXPORTING: Final = "exporting"
ENGINE: Final = "engine"
CATEGORIES: Final = (
    PRODUCTIVE, REDONE, QUEUED, STARTING, VALIDATING, CHECKPOINTING, STALLED, RESTARTING, EXPORTING, ENGINE,
)
# The longest the status's goodput lags behind the operator's count while nothing else of the status changes.
WRITE_SECONDS: Final = 300.0
# A gang that completed no training or validation batch for this long is stalled (rank 0 reports every few
# seconds while batches complete; no step of the jobs dtrain is made for takes a minute).
STALL_SECONDS: Final = 60.0

_STAGES: Final = {
    contract.PROGRESS_STAGE_VALIDATING: VALIDATING,
    contract.PROGRESS_STAGE_CHECKPOINTING: CHECKPOINTING,
    contract.PROGRESS_STAGE_EXPORTING: EXPORTING,
    contract.PROGRESS_STAGE_FINISHING: EXPORTING,
}
_PHASES: Final = {
    "Queued": QUEUED, "Suspended": QUEUED, "Pending": STARTING, "Starting": STARTING, "Restarting": RESTARTING,
    "Exporting": EXPORTING, "BuildingEngine": ENGINE,
}


def instant(value: datetime) -> str:
    """RFC 3339 to the millisecond: counted at every reconcile, whole seconds would add up to more than the job's life."""
    return value.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def stage_category(stage: str | None, step: int | None, redo_until: int | None) -> str:
    """The category of a gang whose rank 0 last reported `stage` at `step`."""
    if stage in _STAGES:
        return _STAGES[stage]
    if stage != contract.PROGRESS_STAGE_TRAINING:
        return STARTING
    return REDONE if redo_until is not None and step is not None and step <= redo_until else PRODUCTIVE


def with_seconds(seconds: Mapping[str, float], category: str, added: float) -> dict[str, float]:
    """`seconds` with `added` more in `category` (never less; rounded to milliseconds)."""
    result = dict(seconds)
    if added > 0:
        result[category] = round(result.get(category, 0.0) + added, 3)
    return result


def ratio(seconds: Mapping[str, float]) -> float | None:
    """Productive seconds over all of them, to three places; None before any second is counted."""
    total = sum(seconds.values())
    return round(seconds.get(PRODUCTIVE, 0.0) / total, 3) if total > 0 else None


# --- The operator: at each reconcile --------------------------------------------------------------------------


def status_category(status: DistributedTrainingStatus, redo_until: int | None) -> str | None:
    """The category a job is in, from its status; None once it finished (nothing is counted any more)."""
    if status.phase in ("Succeeded", "Failed"):
        return None
    if status.phase != "Running":
        return _PHASES.get(status.phase or "Pending", STARTING)
    progress = status.progress
    if progress is None or progress.gang_generation != status.gang_generation:
        return STARTING  # this gang's rank 0 has not reported yet
    return stage_category(progress.stage, progress.step, redo_until)


def account(
    so_far: Goodput | None, read: DistributedTrainingStatus, new: DistributedTrainingStatus, now: datetime,
    created: datetime | None,
) -> Goodput | None:
    """The job's goodput at `now`: the time since `so_far` was counted added to the category it was in, and the
    category from here on taken from `new` (the status this reconcile decided; `read`, the one it read).

    A job counted for the first time is counted from `created` (its creationTimestamp); a finished one keeps its
    count (none, for a job that finished before the operator counted goodput)."""
    if status_category(read, None) is None and (so_far is None or so_far.current is None):
        return so_far
    if so_far is None:
        so_far = Goodput(accounted_at=instant(created or now), current=status_category(read, None))
    seconds = dict(so_far.seconds or {})
    since = parse_time(so_far.accounted_at) or now
    if so_far.current is not None and now > since:
        stalled_from = _stalled_from(so_far.current, read, since, now)
        seconds = with_seconds(seconds, so_far.current, (stalled_from - since).total_seconds())
        seconds = with_seconds(seconds, STALLED, (now - stalled_from).total_seconds())
    progress = read.progress
    highest = max(so_far.highest_step or 0, progress.step if progress is not None and progress.step else 0) or None
    # A new gang: what any earlier gang reached and this one trains again is redone.
    redo_until = highest if new.gang_generation != read.gang_generation else so_far.redo_until
    return Goodput(
        ratio=ratio(seconds), seconds=seconds or None, current=status_category(new, redo_until),
        accounted_at=instant(now), highest_step=highest, redo_until=redo_until,
    )


def worth_a_write(written: Goodput | None, counted: Goodput | None) -> bool:
    """Whether `counted` is to be written though nothing else of the status changed: the status's goodput is
    WRITE_SECONDS old (the operator counts at every reconcile and keeps the count between writes)."""
    if counted is None:
        return False
    if written is None:
        return True
    since, until = parse_time(written.accounted_at), parse_time(counted.accounted_at)
    return since is None or until is None or (until - since).total_seconds() >= WRITE_SECONDS


def latest(written: Goodput | None, kept: Goodput | None) -> Goodput | None:
    """Of the goodput the status holds and the one the operator kept since its last write, the later counted."""
    if written is None or kept is None:
        return kept or written
    never = datetime.min.replace(tzinfo=timezone.utc)
    return kept if (parse_time(kept.accounted_at) or never) >= (parse_time(written.accounted_at) or never) else written


def _stalled_from(current: str, read: DistributedTrainingStatus, since: datetime, now: datetime) -> datetime:
    """Where in [since, now] a training or validating gang's time turned stalled: STALL_SECONDS after its last
    completed batch, as the status read now says (`now`: not stalled)."""
    progress = read.progress
    if current not in (PRODUCTIVE, REDONE, VALIDATING) or progress is None:
        return now
    if progress.gang_generation != read.gang_generation:
        return now
    last_batch = parse_time(progress.batch_time)
    if last_batch is None:
        return now
    return min(now, max(since, last_batch + timedelta(seconds=STALL_SECONDS)))


# --- `dtrain run`: from rank 0's records afterwards ---------------------------------------------------------


def from_records(
    raw_records: Iterable[Mapping[str, Any]], started: datetime, ended: datetime, engine: bool
) -> dict[str, Any]:
    """summary.json's goodput, `{ratio, seconds: {category: s}}`, of a run from `started` to `ended` whose rank 0
    wrote `raw_records` (each gang's, in order); `engine`: the run built an engine after training.

    Each record's time closes the span since the one before, counted in the category the run was in: starting
    until a gang's first training record, then rank 0's stages, stalled for a hang record's stalledSeconds,
    restarting from a gang's error, stop or hang (or its silence) to the next gang's start record, exporting
    (or engine) after the last."""
    seconds: dict[str, float] = {}
    current, since = STARTING, started
    highest, redo_until = 0, None
    gangs = 0
    for record in map(records.read_record, raw_records):
        at = parse_time(getattr(record, "time", None)) if record is not None else None
        if record is None or at is None:
            continue
        at = min(max(at, since), ended)
        if isinstance(record, records.StartRecord):
            gangs += 1
            if gangs > 1:  # the span since the earlier gang's last record: its end, and the restart
                current, redo_until = RESTARTING, highest or None
            seconds = with_seconds(seconds, current, (at - since).total_seconds())
            current, since = STARTING, at
            continue
        if isinstance(record, records.HangRecord):  # rank 0 completed no batch for its stalledSeconds
            stalled_from = max(since, at - timedelta(seconds=record.stalled_seconds or 0))
            seconds = with_seconds(seconds, current, (stalled_from - since).total_seconds())
            current, since = STALLED, stalled_from
        seconds = with_seconds(seconds, current, (at - since).total_seconds())
        since = at
        if isinstance(record, records.ProgressRecord):
            current = stage_category(record.stage, record.step, redo_until)
            highest = max(highest, record.step or 0)
        elif isinstance(record, records.CheckpointRecord):  # written: training goes on
            current = stage_category(contract.PROGRESS_STAGE_TRAINING, record.step, redo_until)
        elif isinstance(record, (records.ErrorRecord, records.StoppedRecord)):
            current = RESTARTING
        elif isinstance(record, (records.ExportRecord, records.FinishedRecord)):
            current = ENGINE if engine and isinstance(record, records.FinishedRecord) else EXPORTING
    seconds = with_seconds(seconds, current, (ended - since).total_seconds())
    return {"ratio": ratio(seconds), "seconds": seconds}
