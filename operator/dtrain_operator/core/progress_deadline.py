"""The progress deadline (runPolicy.progressDeadlineSeconds): a gang that runs but does not train.

A rank stuck in a collective does not exit: every other rank waits with it until the collective
timeout (nccl.timeoutSeconds, 30 minutes by default). Rank 0's progress record carries a batch
counter (`batches`, with `batchTime`) that only the training and validation loops advance, so a
reporter that is still alive proves nothing. The operator and `dtrain run` watch that counter
with their own clocks (no clock skew between a node and the operator counts):

- `observe` keeps a `ProgressWatch`: when the counter last moved, or the gang was last seen not
  all running, or rank 0 last said it was checkpointing, exporting or finishing (those stages hold the
  clock, each for at most runPolicy.stageDeadlineSeconds from when rank 0 entered it: no stage holds a
  job for ever).
  The clock starts at the first report of each gang: until its first batch a start (imports, data,
  the model, a checkpoint to load) may take as long as it takes; a rank that never joins is the
  pre-flight check's and torchrun's rendezvous timeout's to catch;
- `decide` is the one decision, shared by both: nothing, or restart the gang from its last
  checkpoint with reason ProgressDeadlineExceeded (counted against backoffLimit), or fail the job.

Pure: no I/O and no clock of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dtrain_operator.api import Progress, RunPolicy, contract
from dtrain_operator.api.reasons import reason
from dtrain_operator.api.records import ProgressRecord, read_record
from dtrain_operator.core.policy import REASON_BACKOFF_LIMIT, FailureDecision

REASON_PROGRESS_DEADLINE = reason(
    "ProgressDeadlineExceeded", "no batch completed for runPolicy.progressDeadlineSeconds while every worker ran, or "
    "rank 0 stayed in a checkpoint, export or exit beyond stageDeadlineSeconds: the gang restarts (Restarting; Failed "
    "with restartPolicy Never); status.lastHang says where the ranks were",
    "read status.lastHang and the worker logs (a rank stuck in a collective or a data loader?); raise the deadline "
    "only for steps that are that slow",
)
# Stages in which rank 0 works without completing batches, legitimately and for as long as it takes.
HOLDING_STAGES = frozenset(
    {contract.PROGRESS_STAGE_CHECKPOINTING, contract.PROGRESS_STAGE_EXPORTING, contract.PROGRESS_STAGE_FINISHING}
)
# A gang restarted for a hang is stuck in a collective: its SIGTERM handler cannot run (a Python
# handler waits for the blocking call to return), so there is no checkpoint to wait for. Its pods
# are deleted with this grace period rather than spec.terminationGracePeriodSeconds.
HUNG_GANG_GRACE_SECONDS = 5


def survivors_grace_seconds(policy: RunPolicy, pod_grace_seconds: int) -> int | None:
    """The grace period of a gang's other pods once one of its workers failed or was lost; None: the pod's own.

    DDP cannot stop at a step boundary without the lost rank, so a survivor's SIGTERM checkpoint never comes:
    it exits by itself (its peer's connection closed, a collective error) or it waits in a collective whose
    peer is gone (a lost node closes nothing) until nccl.timeoutSeconds. Past the progress deadline, the
    time a user lets a gang go without a batch, a survivor is as hung as such a gang."""
    deadline = policy.progress_deadline_seconds
    return deadline if 0 < deadline < pod_grace_seconds else None

# What identifies one progress report of the training loop: (batches, batchTime), or for a trainer
# that does not report batches, (epoch, step).
Mark = tuple[Any, ...]


@dataclass(frozen=True)
class ProgressWatch:
    """When the watched gang last made progress, by the watcher's clock."""

    generation: int
    """The gang generation (status.gang_generation) watched."""
    mark: Mark
    """The latest progress report seen."""
    since: datetime
    """When training was last seen to advance (or the clock last held: gang not all running, a holding stage)."""
    step: int | None = None
    """The step of the latest report, for messages."""
    stage: str | None = None
    started: bool = False
    """The gang has reported progress of its own (the clock runs only then)."""
    stage_since: datetime | None = None
    """When rank 0 entered the holding stage it reports (None outside one)."""


def mark_of(progress: Progress | None) -> Mark:
    if progress is None:
        return ()
    if progress.batches is not None:
        return ("batches", progress.batches, progress.batch_time)
    return ("step", progress.epoch, progress.step)


def progress_from_record(record: Mapping[str, Any]) -> Progress | None:
    """status.progress as a JSONL progress record of the trainer would set it (for `dtrain run`); None for
    another record."""
    progress = read_record(record)
    if not isinstance(progress, ProgressRecord):
        return None
    return Progress(
        epoch=progress.epoch,
        step=progress.step,
        stage=progress.stage,
        batches=progress.batches,
        batch_time=progress.batch_time,
    )


def observe(
    watch: ProgressWatch | None,
    generation: int,
    all_running: bool,
    progress: Progress | None,
    now: datetime,
) -> ProgressWatch | None:
    """The watch after one look at the gang: None while not every worker runs."""
    if not all_running:
        return None
    mark = mark_of(progress)
    stage = progress.stage if progress is not None else None
    step = progress.step if progress is not None else None
    # A report the operator stamped with this gang's generation is this gang's own; an unstamped one
    # (`dtrain run`, an older operator) counts once the mark moves.
    own = progress is not None and progress.gang_generation == generation
    holding_since = now if stage in HOLDING_STAGES else None
    if watch is None or watch.generation != generation:
        # A new gang, or a new leader after a failover: its clock starts now. A failover that
        # finds this gang's own report watches at once (the deadline counts from the takeover:
        # never early, never never); a new gang's last report may be the old gang's.
        return ProgressWatch(generation, mark, now, step, stage, started=own, stage_since=holding_since)
    if stage in HOLDING_STAGES and stage == watch.stage and mark == watch.mark and watch.stage_since is not None:
        holding_since = watch.stage_since  # still in the same stage: its own clock runs on
    if mark != watch.mark or stage in HOLDING_STAGES or stage != watch.stage or not watch.started:
        started = watch.started or own or mark != watch.mark
        return ProgressWatch(generation, mark, now, step, stage, started=started, stage_since=holding_since)
    return watch


def seconds_without_progress(watch: ProgressWatch | None, now: datetime) -> float:
    return 0.0 if watch is None else max((now - watch.since).total_seconds(), 0.0)


def decide(policy: RunPolicy, watch: ProgressWatch | None, now: datetime, restarts: int) -> FailureDecision | None:
    """Whether the gang has gone past runPolicy.progressDeadlineSeconds, and what to do: the one decision.

    None: no deadline (0), not watched (not every worker runs, or no report of this gang yet), in a
    holding stage, or within it.
    Otherwise restart the gang (ProgressDeadlineExceeded) while backoffLimit allows and
    restartPolicy is not Never; else fail the job.
    """
    deadline = policy.progress_deadline_seconds
    if not deadline or watch is None or not watch.started:
        return None
    where = f"at step {watch.step}" if watch.step is not None else "before the first step"
    if watch.stage in HOLDING_STAGES:
        held = _seconds_in_stage(policy, watch, now)
        if held is None or held <= policy.stage_deadline_seconds:
            return None
        message = (
            f"rank 0 has been {watch.stage} for {held:.0f} s ({where}) while every worker ran: "
            f"runPolicy.stageDeadlineSeconds is {policy.stage_deadline_seconds} (a stuck checkpoint write, export "
            "or exit?)"
        )
    else:
        idle = seconds_without_progress(watch, now)
        if idle <= deadline:
            return None
        message = (
            f"no training or validation batch completed for {idle:.0f} s ({where}) while every worker ran: "
            f"runPolicy.progressDeadlineSeconds is {deadline} (a rank stuck in a collective or a data loader?)"
        )
    if policy.restart_policy == "Never":
        return FailureDecision(False, REASON_PROGRESS_DEADLINE, f"{message} (restartPolicy is Never)")
    if restarts >= policy.backoff_limit:
        return FailureDecision(
            False,
            REASON_BACKOFF_LIMIT,
            f"{message} (gang restarted {restarts} time(s), backoffLimit is {policy.backoff_limit})",
        )
    return FailureDecision(
        True,
        REASON_PROGRESS_DEADLINE,
        f"{message}; restarting the gang from the last checkpoint ({restarts + 1}/{policy.backoff_limit})",
    )


def _seconds_in_stage(policy: RunPolicy, watch: ProgressWatch, now: datetime) -> float | None:
    """How long rank 0 has been in its holding stage, where that stage is bounded (None: it is not)."""
    if not policy.stage_deadline_seconds or watch.stage_since is None:
        return None
    return max((now - watch.stage_since).total_seconds(), 0.0)


def wake_after(policy: RunPolicy, watch: ProgressWatch | None, now: datetime) -> float | None:
    """Seconds until `decide` could change its answer with nothing else happening (None: never)."""
    deadline = policy.progress_deadline_seconds
    if not deadline or watch is None or not watch.started:
        return None
    if watch.stage in HOLDING_STAGES:
        held = _seconds_in_stage(policy, watch, now)
        return None if held is None else max(policy.stage_deadline_seconds - held, 0.0) + 0.1
    return max(deadline - seconds_without_progress(watch, now), 0.0) + 0.1
