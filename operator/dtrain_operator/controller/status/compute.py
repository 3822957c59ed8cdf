"""Status from observation: the job, its observed pods and engine Job, the previous status and `now` in,
the whole new status out. No I/O and no clock of its own.

This is where a phase is decided. The operator patches the difference (`status_patch`) and posts the
Events that `status_events` asks for; `plan.py` decides which children to create and delete from the
status computed here. The trainer writes `progress` and `lastCheckpoint`: they are read here (the
Exporting phase) and never written.
"""

from __future__ import annotations

from datetime import datetime
from typing import Collection, Literal, Optional, Sequence

from dtrain_operator.api import (
    FINISHED_PHASES,
    DistributedTraining,
    DistributedTrainingStatus,
    contract,
    immutable_spec,
)
from dtrain_operator.controller.status.after_training import after_training
from dtrain_operator.controller.status.conditions import (
    CREATED,
    FAILED,
    IMAGE_PULL,
    PODS_PENDING,
    PODS_STUCK,
    REASON_IMAGE_PULL_FAILED,
    REASON_IMMUTABLE_FIELD_CHANGED,
    REASON_INVALID_SPEC,
    REASON_INVALID_SPEC_CHANGE,
    REASON_UNREADABLE_STATUS,
    RESTARTING,
    RUNNING,
    SPEC_IMMUTABLE,
    STATUS_UNREADABLE,
    SUSPENDED,
    Conditions,
)
from dtrain_operator.core import policy, progress_deadline, stragglers
from dtrain_operator.core.accepted import MUTABLE_WHEN_SUSPENDED, accepted_job, changed_immutable_fields
from dtrain_operator.core.gang import (
    current_gang,
    image_pull_deadline,
    node_counts,
    pods_pending_too_long,
    pulling_images,
    reported_stage,
    stuck_terminating,
    worker_failures,
)
from dtrain_operator.core.observation import Limits, Observed, format_time, parse_time


def compute_status(
    job: DistributedTraining,
    observed: Observed,
    previous: Optional[DistributedTrainingStatus],
    now: datetime,
    spec_errors: Sequence[str] = (),
    succeeded_ranks: Collection[int] = (),
    limits: Limits = Limits(),
    progress_watch: Optional[progress_deadline.ProgressWatch] = None,
) -> DistributedTrainingStatus:
    """The whole status of a job, from what is observed now.

    `job` is the object as it is now (its spec may carry rejected changes); the job runs the
    spec recorded in `acceptedSpec` at its first status. `spec_errors` are the validation
    errors of an edit that made an accepted job's spec invalid (`job` then carries the
    accepted spec). `succeeded_ranks` are the ranks of the current gang known to have exited 0
    (see `succeeded_ranks`). `progress_watch` is the caller's watch on training progress
    (`progress_deadline.observe`): past runPolicy.progressDeadlineSeconds the gang restarts.
    Finished jobs keep their status.
    """
    status = (previous or DistributedTrainingStatus()).model_copy(deep=True)
    conditions = Conditions(status.conditions, now)
    never_accepted = status.accepted_spec is None
    if never_accepted:
        status.accepted_spec = immutable_spec(job.spec)
    if never_accepted and status.phase == "Failed":
        # It failed validation before anything was created (a job the operator accepted always
        # has an accepted spec); the spec has been fixed since.
        status = DistributedTrainingStatus(accepted_spec=immutable_spec(job.spec), progress=status.progress)
        conditions = Conditions([], now)
    status.observed_generation = (job.metadata.model_extra or {}).get("generation")
    changed = changed_immutable_fields(job.model_copy(update={"status": status}))
    if changed and status.phase == "Suspended" and all(path.startswith(MUTABLE_WHEN_SUSPENDED) for path in changed):
        # As for a suspended Kubernetes Job (and Kueue's admission): where its pods will run may change.
        status.accepted_spec = immutable_spec(job.spec)
        changed = []
    running_job = accepted_job(job.model_copy(update={"status": status}))
    spec = running_job.spec

    if spec_errors:
        conditions.set(
            SPEC_IMMUTABLE,
            True,
            REASON_INVALID_SPEC_CHANGE,
            f"the changed spec is invalid ({'; '.join(spec_errors)}): the job keeps running with the spec it "
            "was created with. Fix or revert the change",
        )
    elif changed:
        conditions.set(
            SPEC_IMMUTABLE,
            True,
            REASON_IMMUTABLE_FIELD_CHANGED,
            f"{', '.join(changed)} cannot change after the job is created: the job keeps running with the spec it "
            "was created with. Revert the change, or delete the DistributedTraining and create it again",
        )
    else:
        conditions.clear(SPEC_IMMUTABLE, "SpecUnchanged", "the spec matches the one the job was created with")
    conditions.clear(STATUS_UNREADABLE, "StatusRead", "the operator reads the whole status")

    if status.phase in FINISHED_PHASES:
        status.conditions = conditions.items()
        return status

    stuck = stuck_terminating(observed.workers, now, limits)
    if stuck:
        names = ", ".join(p.name for p in stuck)
        conditions.set(
            PODS_STUCK,
            True,
            "TerminationTimeout",
            f"{names}: deleted more than {limits.stuck_terminating_seconds:g} s ago and still terminating (is the "
            "node gone?). A new pod cannot take the name of one still there, so the gang waits for them; the "
            "operator force-deletes those whose node stopped reporting (Ready is not True)",
        )
    else:
        conditions.clear(PODS_STUCK, "NoPodStuck", "no worker pod is stuck terminating")

    total = spec.nodes
    gang = current_gang(status, observed.workers)
    previous_phase = status.phase
    gang_started = previous_phase in ("Running", "Exporting")
    if not gang_started:
        # Until the whole gang runs, a pod on its way out is neither part of the gang nor a
        # failure: the operator deleted it (suspend) or it was deleted before it ran. Its name
        # is reused once it is gone; whatever it does while it terminates counts for nothing.
        gang = {rank: p for rank, p in gang.items() if not p.deleting}
    # Ranks that exited 0 and whose pods are gone since: finished all the same.
    gone_succeeded = {rank for rank in succeeded_ranks if rank not in gang and rank < total}
    # From the phase, not the TrainingSucceeded condition: conditions are shown, never trusted.
    training_done = (
        previous_phase == "BuildingEngine" or 0 in gone_succeeded or (0 in gang and gang[0].phase == "Succeeded")
    )

    def finish(phase: Literal["Succeeded", "Failed"], reason: str, message: str) -> DistributedTrainingStatus:
        status.phase = phase
        conditions.set(phase, True, reason, message)
        conditions.clear(RUNNING, "JobFinished", f"the job {phase.lower()}")
        conditions.clear(RESTARTING, "JobFinished", f"the job {phase.lower()}")
        status.completion_time = format_time(now)
        status.nodes = node_counts(total, list(gang.values()), active=False, gone_succeeded=len(gone_succeeded))
        status.nodes_ready = f"{status.nodes.running}/{total}"
        status.conditions = conditions.items()
        return status

    if status.start_time is None:
        status.start_time = format_time(now)
    if conditions.get(CREATED) is None:
        conditions.set(
            CREATED,
            True,
            "JobCreated",
            f"the operator accepted the job and creates its Service, ConfigMap and {total} worker pod(s)",
        )

    if spec.run_policy.suspend and not training_done:
        status.phase = "Suspended"
        conditions.set(
            SUSPENDED,
            True,
            "JobSuspended",
            "runPolicy.suspend is true: the worker pods are deleted; set it to false to resume from the last checkpoint",
        )
        conditions.clear(RUNNING, "JobSuspended", "the job is suspended")
        conditions.clear(PODS_PENDING, "JobSuspended", "the job is suspended")
        status.nodes = node_counts(total, list(gang.values()), active=False)
        status.nodes_ready = f"{status.nodes.running}/{total}"
        status.conditions = conditions.items()
        return status
    if previous_phase == "Suspended":
        # As for a Kubernetes Job, the deadline counts again from the resume.
        status.start_time = format_time(now)
        conditions.set(SUSPENDED, False, "JobResumed", "runPolicy.suspend is false: the gang starts again")

    started = parse_time(status.start_time)
    if policy.deadline_exceeded(spec.run_policy, started, now):
        return finish("Failed", policy.REASON_DEADLINE, policy.deadline_message(spec.run_policy))

    if training_done:
        return after_training(running_job, status, conditions, gang, observed, finish, now)

    failures = worker_failures(running_job, gang, gang_started=gang_started, succeeded_ranks=gone_succeeded)
    decision = policy.decide_on_failure(spec.run_policy, failures, status.restarts) if failures else None
    if decision is None and gang_started:
        decision = progress_deadline.decide(spec.run_policy, progress_watch, now, status.restarts)
    if decision is not None:
        if not decision.restart:
            return finish("Failed", decision.reason, decision.message)
        status.restarts += 1
        status.phase = "Restarting"
        conditions.set(RESTARTING, True, decision.reason, decision.message)
        conditions.set(
            RUNNING,
            False,
            "GangRestarting",
            "the gang is restarting after a worker failed"
            if failures
            else "the gang is restarting: it made no progress within runPolicy.progressDeadlineSeconds",
        )
        conditions.clear(PODS_PENDING, "GangRestarting", "the gang is restarting")
        status.nodes = node_counts(total, [], active=True)
        status.nodes_ready = f"0/{total}"
        status.conditions = conditions.items()
        return status

    pulling = pulling_images(gang)
    if pulling:
        detail = "; ".join(f"{p.name}: {p.pending_reason}" for p in pulling)
        deadline = image_pull_deadline(pulling, limits)
        if deadline is not None and now >= deadline:
            return finish(
                "Failed",
                REASON_IMAGE_PULL_FAILED,
                f"worker pod(s) could not pull their image for {limits.image_pull_seconds:g} s: {detail}",
            )
        conditions.set(
            IMAGE_PULL,
            True,
            "ImagePullBackOff",
            f"ImagePullBackOff: {detail}. The job fails with {REASON_IMAGE_PULL_FAILED} if the image cannot be "
            f"pulled within {limits.image_pull_seconds:g} s of scheduling",
        )
    else:
        conditions.clear(IMAGE_PULL, "ImagesPulled", "no worker pod is waiting on an image it cannot pull")

    status.nodes = node_counts(total, list(gang.values()), active=True, gone_succeeded=len(gone_succeeded))
    status.nodes_ready = f"{status.nodes.running}/{total}"
    all_running = status.nodes.running == total
    if all_running or previous_phase in ("Running", "Exporting"):
        # Once the whole gang ran, ranks that finish early (exit 0) do not make it Starting again.
        exporting = reported_stage(status.progress, gang) == contract.PROGRESS_STAGE_EXPORTING
        status.phase = "Exporting" if exporting else "Running"
        conditions.set(RUNNING, True, "AllWorkersRunning", f"all {total} worker pod(s) are running")
        conditions.clear(RESTARTING, "GangRunning", f"the restarted gang is running (restart {status.restarts})")
    elif previous_phase == "Restarting":
        status.phase = "Restarting"
    elif len(gang) == total and all(p.scheduled for p in gang.values()):
        status.phase = "Starting"
    else:
        status.phase = "Pending"

    straggler = stragglers.straggler_message(status.progress.step_times if status.progress else None, spec.stragglers)
    if straggler is not None:
        conditions.set(stragglers.CONDITION, True, stragglers.REASON_DETECTED, straggler)
    elif conditions.is_true(stragglers.CONDITION):
        conditions.clear(stragglers.CONDITION, stragglers.REASON_NONE, "no rank is slower than the others now")
    too_long = pods_pending_too_long(running_job, gang, now)
    if too_long:
        timeout = spec.scheduling.gang.schedule_timeout_seconds
        details = "; ".join(f"{p.name}: {p.pending_reason}" for p in too_long)
        conditions.set(PODS_PENDING, True, "PodsPendingTooLong", f"Pending for more than {timeout} s: {details}")
    else:
        conditions.clear(PODS_PENDING, "PodsStarted", "no worker pod is Pending beyond the schedule timeout")
    status.conditions = conditions.items()
    return status


def succeeded_ranks(
    status: DistributedTrainingStatus, observed: Observed, earlier: Collection[int] = (), earlier_generation: Optional[int] = None
) -> frozenset[int]:
    """Ranks of the current gang that exited 0, for the operator's record: those seen Succeeded
    while the gang ran, and those recorded earlier for the same generation. A suspend forgets
    them (the resumed gang runs every rank again)."""
    if status.phase == "Suspended":
        return frozenset()
    kept = frozenset(earlier) if earlier_generation == status.restarts else frozenset()
    if status.phase not in ("Running", "Exporting", "BuildingEngine", "Succeeded"):
        return kept
    seen = {p.rank for p in current_gang(status, observed.workers).values() if p.phase == "Succeeded"}
    return kept | {rank for rank in seen if rank is not None}


def unreadable_status(
    read: DistributedTrainingStatus, problems: Sequence[str], now: datetime
) -> DistributedTrainingStatus:
    """The status as read, with a StatusUnreadable condition naming what the operator could not read.

    The operator does not act on a status it cannot read in full: it leaves the job's pods
    alone, and its own record of the job (trusted.py) stays as it was.
    """
    status = read.model_copy(deep=True)
    conditions = Conditions(status.conditions, now)
    conditions.set(
        STATUS_UNREADABLE,
        True,
        REASON_UNREADABLE_STATUS,
        f"the operator cannot read {'; '.join(problems)}. It leaves the job's pods alone until it can: "
        "fix or remove what it names (kubectl patch --subresource=status)",
    )
    status.conditions = conditions.items()
    return status


def invalid_status(
    previous: Optional[DistributedTrainingStatus], errors: Sequence[str], generation: Optional[int], now: datetime
) -> DistributedTrainingStatus:
    """Failed/InvalidSpec with the validation messages, for an object that does not validate.

    A job that was already accepted keeps running its accepted spec, so this applies only to
    objects the operator never accepted.
    """
    status = (previous or DistributedTrainingStatus()).model_copy(deep=True)
    conditions = Conditions(status.conditions, now)
    message = "the spec is invalid: " + "; ".join(errors) + ". Fix the spec (see `dtrain validate`)"
    conditions.set(FAILED, True, REASON_INVALID_SPEC, message)
    status.phase = "Failed"
    status.observed_generation = generation
    if status.completion_time is None:
        status.completion_time = format_time(now)
    status.conditions = conditions.items()
    return status
