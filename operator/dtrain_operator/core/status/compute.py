"""Status from observation: the job, its observed pods and engine Job, the previous status and `now` in,
the whole new status out. No I/O and no clock of its own.

This is where a phase is decided. The operator patches the difference (`status_patch`) and posts the
Events that `status_events` asks for; `core/child_plan.py` decides which children to create and delete from the
status computed here. The trainer writes `progress` and `lastCheckpoint`: they are read here (the
Exporting phase) and never written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from dtrain_operator.api import (
    FINISHED_PHASES,
    DistributedTraining,
    DistributedTrainingStatus,
    contract,
    immutable_spec,
)
from dtrain_operator.core import goodput, in_place, policy, progress_deadline, restart_decision
from dtrain_operator.core.accepted import MUTABLE_WHEN_SUSPENDED, accepted_job, changed_immutable_fields
from dtrain_operator.core.gang_state import (
    current_gang,
    image_pull_deadline,
    pulling_images,
    reported_stage,
    stuck_terminating,
    succeeded_ranks,
    worker_failures,
)
from dtrain_operator.core.observation import Limits, Observed, format_time, parse_time
from dtrain_operator.core.status import gpu_memory, hang, restarts, storage_conditions
from dtrain_operator.core.status.after_training import after_training
from dtrain_operator.core.status.computation import StatusComputation
from dtrain_operator.core.status.conditions import (
    CREATED,
    IMAGE_PULL,
    POD_LOCAL_STORAGE,
    PODS_PENDING,
    PODS_STUCK,
    REASON_ALL_WORKERS_RUNNING,
    REASON_GANG_RUNNING,
    REASON_IMAGE_PULL_BACK_OFF,
    REASON_IMAGE_PULL_FAILED,
    REASON_IMAGES_PULLED,
    REASON_IMMUTABLE_FIELD_CHANGED,
    REASON_INVALID_SPEC_CHANGE,
    REASON_JOB_CREATED,
    REASON_JOB_RESUMED,
    REASON_JOB_SUSPENDED,
    REASON_NO_POD_STUCK,
    REASON_SPEC_UNCHANGED,
    REASON_STATUS_READ,
    REASON_TERMINATION_TIMEOUT,
    RESTARTING,
    RUNNING,
    SPEC_IMMUTABLE,
    STATUS_UNREADABLE,
    SUSPENDED,
    Conditions,
)
from dtrain_operator.core.status.queued import report_queue
from dtrain_operator.core.status.reports import report_missed_checkpoints, report_pending_pods, report_stragglers
from dtrain_operator.core.status.resize import resize_elastic_gang

StatusStep = Callable[[StatusComputation], DistributedTrainingStatus | None]


def accept_spec(c: StatusComputation) -> None:
    """Record the spec the job runs at its first status, and say when an edit is not applied."""
    status = c.status
    never_accepted = c.accepted_now = status.accepted_spec is None
    if never_accepted:
        status.accepted_spec = immutable_spec(c.job.spec)
    if never_accepted and status.phase == "Failed":
        # It failed validation before anything was created (a job the operator accepted always
        # has an accepted spec); the spec has been fixed since.
        c.status = status = DistributedTrainingStatus(accepted_spec=immutable_spec(c.job.spec), progress=status.progress)
        c.conditions = Conditions([], c.now)
    status.observed_generation = (c.job.metadata.model_extra or {}).get("generation")
    changed = changed_immutable_fields(c.job.model_copy(update={"status": status}))
    if changed and status.phase == "Suspended" and all(path.startswith(MUTABLE_WHEN_SUSPENDED) for path in changed):
        # As for a suspended Kubernetes Job (and Kueue's admission): where its pods will run may change.
        status.accepted_spec = immutable_spec(c.job.spec)
        changed = []
    c.running_job = accepted_job(c.job.model_copy(update={"status": status}))
    if c.spec_errors:
        c.conditions.set(
            SPEC_IMMUTABLE,
            True,
            REASON_INVALID_SPEC_CHANGE,
            f"the changed spec is invalid ({'; '.join(c.spec_errors)}): the job keeps running with the spec it "
            "was created with. Fix or revert the change",
        )
    elif changed:
        c.conditions.set(
            SPEC_IMMUTABLE,
            True,
            REASON_IMMUTABLE_FIELD_CHANGED,
            f"{', '.join(changed)} cannot change after the job is created: the job keeps running with the spec it "
            "was created with. Revert the change, or delete the DistributedTraining and create it again",
        )
    else:
        c.conditions.clear(SPEC_IMMUTABLE, REASON_SPEC_UNCHANGED, "the spec matches the one the job was created with")
    c.conditions.clear(STATUS_UNREADABLE, REASON_STATUS_READ, "the operator reads the whole status")


def check_gpu_memory(c: StatusComputation) -> None:
    """At creation only: whether the recorded memory estimate fits the GPU (GPUMemoryExceeded)."""
    if not c.accepted_now:
        return
    verdict = gpu_memory.verdict((c.job.metadata.model_extra or {}).get("annotations"), c.spec)
    if verdict is not None:
        c.conditions.set(gpu_memory.CONDITION, verdict.status, verdict.reason, verdict.message)


def check_pod_local_storage(c: StatusComputation) -> None:
    """At creation only: a job without shared storage keeps its checkpoints on the pod's disk (PodLocalStorage)."""
    message = storage_conditions.pod_local_message(c.job) if c.accepted_now else None
    if message is not None:
        c.conditions.set(POD_LOCAL_STORAGE, True, storage_conditions.POD_LOCAL_REASON, message)


def keep_finished(c: StatusComputation) -> DistributedTrainingStatus | None:
    """Finished jobs keep their status."""
    return c.done() if c.status.phase in FINISHED_PHASES else None


def report_stuck_pods(c: StatusComputation) -> None:
    stuck = stuck_terminating(c.observed.workers, c.now, c.limits)
    if stuck:
        names = ", ".join(p.name for p in stuck)
        c.conditions.set(
            PODS_STUCK,
            True,
            REASON_TERMINATION_TIMEOUT,
            f"{names}: still terminating {c.limits.stuck_terminating_seconds:g} s after the end of the grace period "
            "(is the node gone?). A new pod cannot take the name of one still there, so the gang waits for them; the "
            "operator force-deletes those whose node stopped reporting (Ready is not True)",
        )
    else:
        c.conditions.clear(PODS_STUCK, REASON_NO_POD_STUCK, "no worker pod is stuck terminating")


def read_gang(c: StatusComputation) -> None:
    """The current gang's pods, and whether training is over."""
    gang = current_gang(c.status, c.observed.workers)
    c.previous_phase = c.status.phase
    c.gang_started = c.previous_phase in ("Running", "Exporting")
    if not c.gang_started:
        # Until the whole gang runs, a pod on its way out is neither part of the gang nor a
        # failure: the operator deleted it (suspend) or it was deleted before it ran. Its name
        # is reused once it is gone; whatever it does while it terminates counts for nothing.
        gang = {rank: p for rank, p in gang.items() if not p.deleting}
    c.gang = gang
    c.gone_succeeded = {rank for rank in c.succeeded_ranks if rank not in gang and rank < c.total}
    # From the phase, not the TrainingSucceeded condition: conditions are shown, never trusted.
    c.training_done = (
        c.previous_phase == "BuildingEngine" or 0 in c.gone_succeeded or (0 in gang and gang[0].phase == "Succeeded")
    )


def record_creation(c: StatusComputation) -> None:
    if c.status.start_time is None:
        c.status.start_time = format_time(c.now)
    if c.conditions.get(CREATED) is None:
        c.conditions.set(
            CREATED,
            True,
            REASON_JOB_CREATED,
            f"the operator accepted the job and creates its Service and {c.total} worker pod(s)",
        )


def suspend_or_resume(c: StatusComputation) -> DistributedTrainingStatus | None:
    if c.spec.run_policy.suspend and not c.training_done:
        c.status.phase = "Suspended"
        c.conditions.set(
            SUSPENDED,
            True,
            REASON_JOB_SUSPENDED,
            "runPolicy.suspend is true: the worker pods are deleted; set it to false to resume from the last checkpoint",
        )
        c.conditions.clear(RUNNING, REASON_JOB_SUSPENDED, "the job is suspended")
        c.conditions.clear(PODS_PENDING, REASON_JOB_SUSPENDED, "the job is suspended")
        c.count_nodes(list(c.gang.values()), active=False)
        return c.done()
    if c.previous_phase == "Suspended":
        # As for a Kubernetes Job, the deadline counts again from the resume.
        c.status.start_time = format_time(c.now)
        c.conditions.set(SUSPENDED, False, REASON_JOB_RESUMED, "runPolicy.suspend is false: the gang starts again")
    return None


def enforce_active_deadline(c: StatusComputation) -> DistributedTrainingStatus | None:
    if policy.deadline_exceeded(c.spec.run_policy, parse_time(c.status.start_time), c.now):
        return c.finish(policy.deadline_ending(c.spec.run_policy))
    return None


def finish_training(c: StatusComputation) -> DistributedTrainingStatus | None:
    """Rank 0 exited 0: the export's outcome, then the engine Job."""
    if not c.training_done:
        return None
    return after_training(c.running_job, c.status, c.conditions, c.gang, c.observed, c.finish, c.now)


def await_in_place_restart(c: StatusComputation) -> DistributedTrainingStatus | None:
    """An in-place restart under way (core.in_place), or given up: its pods recreated, counted once."""
    if not in_place.kept_pods_expected(c.status) or c.gang:
        return None
    restarts.await_in_place(c.running_job, c.status, c.conditions, c.observed.workers, c.now)
    c.count_nodes([], active=True)
    return c.done()


def restart_or_fail(c: StatusComputation) -> DistributedTrainingStatus | None:
    """A failed, lost or vanished worker, or a gang past its progress deadline: core.restart_decision decides."""
    c.failures = worker_failures(c.running_job, c.gang, c.gang_started, c.gone_succeeded, c.total)
    status = c.status
    decision = restart_decision.decide(
        c.spec, c.failures, status.restarts,
        lambda: hang.past_progress_deadline(c.spec, c.progress_watch, status, c.gang, c.now) if c.gang_started else None,
    )
    if decision is None:
        return None
    if not decision.restart:
        return c.finish(decision.ending)
    strategy, why = in_place.strategy(c.running_job, decision, c.failures, c.gang, c.now, c.total)
    restarts.record_restart(status, c.conditions, decision, (strategy, why), hung=not c.failures, now=c.now)
    c.count_nodes([], active=True)
    return c.done()


def watch_image_pulls(c: StatusComputation) -> DistributedTrainingStatus | None:
    pulling = pulling_images(c.gang)
    if not pulling:
        c.conditions.clear(IMAGE_PULL, REASON_IMAGES_PULLED, "no worker pod is waiting on an image it cannot pull")
        return None
    detail = "; ".join(f"{p.name}: {p.pending_reason}" for p in pulling)
    deadline = image_pull_deadline(pulling, c.limits)
    seconds = c.limits.image_pull_seconds
    if deadline is not None and c.now >= deadline:
        message = f"worker pod(s) could not pull their image for {seconds:g} s: {detail}"
        return c.finish(policy.Ending("Failed", REASON_IMAGE_PULL_FAILED, message))
    c.conditions.set(
        IMAGE_PULL,
        True,
        REASON_IMAGE_PULL_BACK_OFF,
        f"ImagePullBackOff: {detail}. The job fails with {REASON_IMAGE_PULL_FAILED} if the image cannot be "
        f"pulled within {seconds:g} s of scheduling",
    )
    return None


def set_phase(c: StatusComputation) -> None:
    """Pending, Starting, Running or Exporting, from the gang's pods."""
    status, total = c.status, c.total
    c.count_nodes(list(c.gang.values()), active=True, gone_succeeded=len(c.gone_succeeded))
    all_running = status.nodes is not None and status.nodes.running == total
    if all_running or c.previous_phase in ("Running", "Exporting"):
        # Once the whole gang ran, ranks that finish early (exit 0) do not make it Starting again.
        exporting = reported_stage(status.progress, c.gang) == contract.PROGRESS_STAGE_EXPORTING
        status.phase = "Exporting" if exporting else "Running"
        c.conditions.set(RUNNING, True, REASON_ALL_WORKERS_RUNNING, f"all {total} worker pod(s) are running")
        c.conditions.clear(RESTARTING, REASON_GANG_RUNNING, f"the restarted gang is running (restart {status.restarts})")
    elif c.previous_phase == "Restarting":
        status.phase = "Restarting"
    elif len(c.gang) == total and all(p.scheduled for p in c.gang.values()):
        status.phase = "Starting"
    else:
        status.phase = "Pending"


# The order is the decision: a finished job is kept before anything is looked at, a suspend wins
# over a deadline, success after training over a late worker failure, a failure over pending pods.
STATUS_STEPS: tuple[StatusStep, ...] = (
    accept_spec,
    check_gpu_memory,
    check_pod_local_storage,
    keep_finished,
    report_stuck_pods,
    read_gang,
    record_creation,
    suspend_or_resume,
    enforce_active_deadline,
    finish_training,
    await_in_place_restart,
    restart_or_fail,
    watch_image_pulls,
    resize_elastic_gang,
    set_phase,
    report_queue,
    report_stragglers,
    report_missed_checkpoints,
    report_pending_pods,
)


def compute_status(
    job: DistributedTraining,
    observed: Observed,
    previous: DistributedTrainingStatus | None,
    now: datetime,
    spec_errors: Sequence[str] = (),
    limits: Limits = Limits(),
    progress_watch: progress_deadline.ProgressWatch | None = None,
) -> DistributedTrainingStatus:
    """The whole status of a job, from what is observed now: the STATUS_STEPS in order.

    `job` is the object as it is now (its spec may carry rejected changes); the job runs the
    spec recorded in `acceptedSpec` at its first status. `spec_errors` are the validation
    errors of an edit that made an accepted job's spec invalid (`job` then carries the
    accepted spec). `progress_watch` is the caller's watch on training progress
    (`progress_deadline.observe`): past runPolicy.progressDeadlineSeconds the gang restarts.
    Finished jobs keep their status. `succeededRanks` carries the ranks of the current gang that
    exited 0 from one status to the next (`succeeded_ranks`); `goodput` counts the time since
    `previous` in the category it was in (`goodput.account`).
    """
    status = (previous or DistributedTrainingStatus()).model_copy(deep=True)
    earlier = tuple(status.succeeded_ranks or ())
    computation = StatusComputation(
        job, observed, now, spec_errors, earlier, limits, progress_watch, status, Conditions(status.conditions, now)
    )
    new = _run_steps(computation)
    finished = succeeded_ranks(new, observed, earlier, previous.gang_generation if previous else None)
    new.succeeded_ranks = sorted(finished) or None
    read = previous or DistributedTrainingStatus()
    created = parse_time((job.metadata.model_extra or {}).get("creationTimestamp"))
    new.goodput = goodput.account(read.goodput, read, new, now, created)
    return new


def _run_steps(computation: StatusComputation) -> DistributedTrainingStatus:
    for step in STATUS_STEPS:
        finished = step(computation)
        if finished is not None:
            return finished
    return computation.done()
