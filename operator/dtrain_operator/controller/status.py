"""Status from observation: the job, its observed pods and engine Job, the previous status and `now` in,
the whole new status out. No I/O and no clock of its own.

This is where a phase is decided. The operator patches the difference (`status_patch`) and posts the
Events that `status_events` asks for; `plan.py` decides which children to create and delete from the
status computed here. The trainer writes `progress` and `lastCheckpoint`: they are read here (the
Exporting phase) and never written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Collection, Literal, Mapping, Optional, Sequence

from pydantic import ValidationError

from dtrain_operator.api import (
    FINISHED_PHASES,
    Condition,
    DistributedTraining,
    DistributedTrainingSpec,
    DistributedTrainingStatus,
    NodeCounts,
    Progress,
    contract,
    immutable_spec,
    with_env_values,
)
from dtrain_operator.api.redaction import redact_text
from dtrain_operator.core import policy, progress_deadline, stragglers
from dtrain_operator.core.policy import WorkerFailure
from dtrain_operator.core.render import ENGINE_CONTAINER, TRAINER_CONTAINER, engine_job_name, worker_pod_name

# Condition types.
CREATED = "Created"
RUNNING = "Running"
RESTARTING = "Restarting"
TRAINING_SUCCEEDED = "TrainingSucceeded"
ENGINE_BUILT = "EngineBuilt"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
PODS_PENDING = "PodsPending"
SPEC_IMMUTABLE = "SpecImmutable"
STATUS_UNREADABLE = "StatusUnreadable"
PODS_STUCK = "PodsStuckTerminating"
IMAGE_PULL = "ImagePullFailing"
# Training succeeded but rank 0 could not export model.onnx (the trainer's results say why).
EXPORT_FAILED = "ExportFailed"

REASON_INVALID_SPEC = "InvalidSpec"
REASON_ENGINE_BUILD_FAILED = "EngineBuildFailed"
REASON_IMMUTABLE_FIELD_CHANGED = "ImmutableFieldChanged"
REASON_INVALID_SPEC_CHANGE = "InvalidSpecChange"
REASON_UNREADABLE_STATUS = "UnreadableStatus"
REASON_IMAGE_PULL_FAILED = "ImagePullFailed"
# The kubelet's waiting reasons of a container whose image cannot be pulled (they alternate
# while it backs off: ErrImagePull, ImagePullBackOff, ErrImagePull, ...).
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
)
# Fields that may change while the job is suspended: its scheduling directives.
MUTABLE_WHEN_SUSPENDED = ("spec.scheduling.",)

# Pod-level reasons of a pod that the node or the cluster took away (it did not exit by itself).
_LOST_POD_REASONS = frozenset({"Evicted", "Preempting", "NodeLost", "Shutdown", "NodeShutdown", "Terminated"})
# Condition messages stay short enough to read in `kubectl describe`; termination messages can be 4 KiB.
MAX_MESSAGE_CHARS = 1024
MAX_POD_MESSAGE_CHARS = 400
# How long a finished engine Job waits for its pod to be seen (see engine_pod_awaited).
ENGINE_POD_GRACE_SECONDS = 30.0


# --- What the operator observes ---------------------------------------------------------------


@dataclass(frozen=True)
class PodObservation:
    """The little the operator needs to know about one of a job's pods (worker or engine)."""

    name: str
    uid: str
    resource_version: str
    role: str
    rank: Optional[int]
    generation: Optional[int]
    phase: str
    deleting: bool = False
    created_at: Optional[datetime] = None
    scheduled: bool = False
    pending_reason: str = ""
    exit_code: Optional[int] = None
    reason: str = ""
    message: str = ""
    # True when the pod did not exit by itself: evicted, preempted, its node lost.
    lost: bool = False
    owner_uid: Optional[str] = None
    finished_at: Optional[datetime] = None
    deleted_at: Optional[datetime] = None
    ready: bool = False
    waiting_reason: str = ""
    """The trainer container's waiting reason (ErrImagePull, ImagePullBackOff, ContainerCreating, ...)."""
    scheduled_at: Optional[datetime] = None


@dataclass(frozen=True)
class Limits:
    """How long the operator waits on the cluster before it says so and acts (the operator's flags)."""

    stuck_terminating_seconds: float = 150.0
    """A deleted pod still there this long after its deletion is stuck (its node may be gone)."""
    image_pull_seconds: float = 300.0
    """A worker pod that cannot pull its image this long after it was scheduled fails the job (ImagePullFailed)."""


@dataclass(frozen=True)
class EngineJobObservation:
    """The engine Job: finished or not, and how."""

    name: str
    uid: str
    resource_version: str
    succeeded: bool = False
    failed: bool = False
    reason: str = ""
    message: str = ""
    deleting: bool = False
    owner_uid: Optional[str] = None
    finished_at: Optional[datetime] = None

    @property
    def finished(self) -> bool:
        return self.succeeded or self.failed


@dataclass(frozen=True)
class Observed:
    """Everything observed about one job's children."""

    workers: tuple[PodObservation, ...] = ()
    engine_pods: tuple[PodObservation, ...] = ()
    engine_job: Optional[EngineJobObservation] = None


def parse_time(value: Optional[str]) -> Optional[datetime]:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def format_time(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_label(labels: Mapping[str, str], key: str) -> Optional[int]:
    try:
        return int(labels[key])
    except (KeyError, ValueError, TypeError):
        return None


def _container_status(statuses: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    for status in statuses:
        if status.get("name") == name:
            return status
    return statuses[0] if statuses else {}


def _pending_reason(status: Mapping[str, Any], container: Mapping[str, Any]) -> str:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return _join(condition.get("reason") or "Unschedulable", condition.get("message"))
    waiting = (container.get("state") or {}).get("waiting")
    if waiting:
        return _join(waiting.get("reason") or "Waiting", waiting.get("message"))
    return "ContainerCreating" if status.get("conditions") else "Unscheduled"


def _join(reason: str, message: Optional[str]) -> str:
    return f"{reason}: {message}" if message else reason


def controller_uid(meta: Mapping[str, Any]) -> Optional[str]:
    """The uid of the object's controlling owner (its ownerReference with controller: true)."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def observe_pod(raw: Mapping[str, Any]) -> PodObservation:
    """A pod as the API server returns it, reduced to a PodObservation."""
    meta = raw.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = raw.get("status") or {}
    role = labels.get(contract.LABEL_ROLE, "")
    container = _container_status(
        status.get("containerStatuses") or [], ENGINE_CONTAINER if role == contract.ROLE_ENGINE else TRAINER_CONTAINER
    )
    state = container.get("state") or {}
    terminated = state.get("terminated") or {}
    phase = status.get("phase") or "Pending"
    conditions = status.get("conditions") or []
    disruption = next(
        (c for c in conditions if c.get("type") == "DisruptionTarget" and c.get("status") == "True"), None
    )
    lost = status.get("reason") in _LOST_POD_REASONS or (phase == "Failed" and disruption is not None)
    if lost:
        reason = status.get("reason") or (disruption or {}).get("reason") or "Lost"
        message = status.get("message") or (disruption or {}).get("message") or ""
    else:
        reason = terminated.get("reason") or status.get("reason") or ""
        message = terminated.get("message") or status.get("message") or ""
    scheduled = bool((raw.get("spec") or {}).get("nodeName")) or any(
        c.get("type") == "PodScheduled" and c.get("status") == "True" for c in conditions
    )
    return PodObservation(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        resource_version=str(meta.get("resourceVersion", "")),
        role=role,
        rank=_int_label(labels, contract.LABEL_NODE_RANK),
        generation=_int_label(labels, contract.LABEL_GANG_GENERATION),
        phase=phase,
        deleting=bool(meta.get("deletionTimestamp")),
        created_at=parse_time(meta.get("creationTimestamp")),
        scheduled=scheduled,
        pending_reason=_pending_reason(status, container) if phase == "Pending" else "",
        exit_code=None if lost else terminated.get("exitCode"),
        reason=reason,
        message=message[-contract.TERMINATION_MESSAGE_MAX_BYTES :],
        lost=lost,
        owner_uid=controller_uid(meta),
        finished_at=parse_time(terminated.get("finishedAt"))
        or parse_time((disruption or {}).get("lastTransitionTime")),
        deleted_at=parse_time(meta.get("deletionTimestamp")),
        waiting_reason=str(((state.get("waiting") or {}).get("reason")) or ""),
        scheduled_at=next(
            (
                parse_time(c.get("lastTransitionTime"))
                for c in conditions
                if c.get("type") == "PodScheduled" and c.get("status") == "True"
            ),
            None,
        ),
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
    )


def observe_engine_job(raw: Mapping[str, Any]) -> EngineJobObservation:
    """A batch/v1 Job as the API server returns it, reduced to an EngineJobObservation."""
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    succeeded = failed = False
    reason = message = ""
    finished_at = parse_time(status.get("completionTime"))
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") in ("Complete", "SuccessCriteriaMet"):
            succeeded = True
        elif condition.get("type") in ("Failed", "FailureTarget"):
            failed = True
            reason = condition.get("reason") or "Failed"
            message = condition.get("message") or ""
        else:
            continue
        finished_at = finished_at or parse_time(condition.get("lastTransitionTime"))
    return EngineJobObservation(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        resource_version=str(meta.get("resourceVersion", "")),
        succeeded=succeeded and not failed,
        failed=failed,
        reason=reason,
        message=message,
        deleting=bool(meta.get("deletionTimestamp")),
        owner_uid=controller_uid(meta),
        finished_at=finished_at,
    )


def engine_pod_awaited(observed: Observed, now: datetime) -> Optional[float]:
    """Seconds left to wait for the finished engine pod, whose termination message holds the results.

    The Job and its pods come through separate watches, so a Job can be seen finished before its
    pod is. None when there is nothing to wait for (the pod is seen, or it waited long enough).
    """
    job = observed.engine_job
    if job is None or not job.finished or any(p.phase in ("Succeeded", "Failed") for p in observed.engine_pods):
        return None
    if job.finished_at is None:
        return None
    left = ENGINE_POD_GRACE_SECONDS - (now - job.finished_at).total_seconds()
    return left if left > 0 else None


def termination_results(message: str) -> Optional[dict[str, Any]]:
    """The JSON object a trainer or engine container left in its termination message, if it is one."""
    text = message.strip()
    if not text.startswith("{") or len(text.encode()) > contract.TERMINATION_MESSAGE_MAX_BYTES:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- The spec the job runs ---------------------------------------------------------------------


def accepted_job(job: DistributedTraining) -> DistributedTraining:
    """The job as the operator runs it: the spec accepted at creation, with today's mutable fields.

    Before the first status is written (or when the recorded spec no longer validates, e.g.
    after an operator upgrade tightened a rule), that is the object's own spec.
    """
    accepted = job.status.accepted_spec if job.status else None
    if not accepted:
        return job
    run_policy = dict(accepted.get("runPolicy") or {})
    run_policy["suspend"] = job.spec.run_policy.suspend
    run_policy["ttlSecondsAfterFinished"] = job.spec.run_policy.ttl_seconds_after_finished
    try:
        spec = DistributedTrainingSpec.model_validate({**accepted, "runPolicy": run_policy})
    except ValidationError:
        return job
    return job.model_copy(update={"spec": with_env_values(spec, job.spec.env)})


def _changed_paths(old: Any, new: Any, prefix: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        paths: list[str] = []
        for key in sorted(set(old) | set(new)):
            paths.extend(_changed_paths(old.get(key), new.get(key), f"{prefix}.{key}"))
        return paths
    return [] if old == new else [prefix]


def changed_immutable_fields(job: DistributedTraining) -> list[str]:
    """Spec fields (dotted paths) that differ from the spec the job was created with."""
    running = accepted_job(job)
    if running is job:
        return []
    return _changed_paths(immutable_spec(running.spec), immutable_spec(job.spec), "spec")


# --- Conditions ------------------------------------------------------------------------------------


def _truncate(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tail(text: str, limit: int = MAX_POD_MESSAGE_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


class _Conditions:
    """Kubernetes condition semantics: lastTransitionTime moves only when the status flips."""

    def __init__(self, conditions: Sequence[Condition], now: datetime) -> None:
        self._items = [c.model_copy() for c in conditions]
        self._now = format_time(now)

    def get(self, type_: str) -> Optional[Condition]:
        return next((c for c in self._items if c.type == type_), None)

    def is_true(self, type_: str) -> bool:
        condition = self.get(type_)
        return condition is not None and condition.status == "True"

    def set(self, type_: str, status: bool, reason: str, message: str) -> None:
        value: Literal["True", "False"] = "True" if status else "False"
        # Messages quote trainer logs and termination messages, and become Events that `view` can read.
        message = _truncate(redact_text(message))
        condition = self.get(type_)
        if condition is None:
            self._items.append(
                Condition(type=type_, status=value, reason=reason, message=message, last_transition_time=self._now)
            )
            return
        if condition.status != value:
            condition.last_transition_time = self._now
        condition.status, condition.reason, condition.message = value, reason, message

    def clear(self, type_: str, reason: str, message: str) -> None:
        """Set False, but only if the condition was ever set: absent conditions stay absent."""
        if self.get(type_) is not None:
            self.set(type_, False, reason, message)

    def items(self) -> list[Condition]:
        return self._items


# --- The status ---------------------------------------------------------------------------------------


def _node_counts(total: int, pods: Sequence[PodObservation], active: bool, gone_succeeded: int = 0) -> NodeCounts:
    running = sum(p.phase == "Running" for p in pods)
    succeeded = sum(p.phase == "Succeeded" for p in pods) + gone_succeeded
    failed = sum(p.phase == "Failed" for p in pods)
    # While the job runs, a pod not yet created counts as pending; otherwise only pods that exist.
    pending = max(total - running - succeeded - failed, 0) if active else sum(p.phase == "Pending" for p in pods)
    return NodeCounts(total=total, pending=pending, running=running, succeeded=succeeded, failed=failed)


def current_gang(status: DistributedTrainingStatus, workers: Sequence[PodObservation]) -> dict[int, PodObservation]:
    """Worker pods of the current gang generation by rank (older generations are on their way out)."""
    return {
        p.rank: p
        for p in workers
        if p.generation == status.restarts and p.rank is not None and p.role == contract.ROLE_WORKER
    }


def worker_failures(
    job: DistributedTraining,
    gang: Mapping[int, PodObservation],
    gang_started: bool,
    succeeded_ranks: Collection[int] = (),
) -> list[WorkerFailure]:
    """Workers of the current gang that failed, were lost, or vanished.

    A missing pod is a failure only once the whole gang has run (`gang_started`): before that it
    is simply not created yet. Once the gang runs, a pod being deleted is a failure because the
    operator deletes pods of a running gang only when it stops the job, and then it asks no more
    questions; before, `compute_status` leaves pods on their way out out of the gang. A rank
    that exited 0 (`succeeded_ranks`) stays finished when its pod goes (drained, collected).
    """
    failures: list[WorkerFailure] = []
    for rank in range(job.spec.nodes):
        pod = gang.get(rank)
        if pod is None:
            if gang_started and rank not in succeeded_ranks:
                name = worker_pod_name(job, rank)
                failures.append(WorkerFailure(rank, None, "Deleted", f"pod {name} was deleted"))
        elif pod.phase == "Failed":
            failures.append(
                WorkerFailure(rank, pod.exit_code, pod.reason or "Error", _tail(pod.message), pod.finished_at)
            )
        elif pod.deleting and pod.phase != "Succeeded":
            failures.append(WorkerFailure(rank, None, "Deleted", f"pod {pod.name} is being deleted"))
    return failures


# Kubernetes' timestamps have a resolution of one second: a report counts for the gang only when
# it came at least this long after the gang's rank-0 pod was created.
REPORT_AFTER_CREATION_SECONDS = 1.0


def reported_stage(progress: Optional[Progress], gang: Mapping[int, PodObservation]) -> Optional[str]:
    """The stage rank 0 reported, if this gang reported it: progress outlives the gang that wrote
    it, so a report from before the current rank-0 pod was created (an earlier gang's
    `exporting`) says nothing about this one. A report without a time is not tied to any gang."""
    if progress is None or progress.stage is None:
        return None
    reported = parse_time(progress.updated_at)
    rank0 = gang.get(0)
    if reported is None or rank0 is None or rank0.created_at is None:
        return None
    if (reported - rank0.created_at).total_seconds() < REPORT_AFTER_CREATION_SECONDS:
        return None
    return progress.stage


def stuck_terminating(workers: Sequence[PodObservation], now: datetime, limits: Limits) -> list[PodObservation]:
    """Worker pods deleted longer ago than limits.stuck_terminating_seconds and still there."""
    return sorted(
        (
            p
            for p in workers
            if p.deleting
            and p.deleted_at is not None
            and (now - p.deleted_at).total_seconds() >= limits.stuck_terminating_seconds
        ),
        key=lambda p: p.name,
    )


def pulling_images(gang: Mapping[int, PodObservation]) -> list[PodObservation]:
    """Pods of the current gang whose trainer container waits on an image it cannot pull."""
    return [
        p
        for p in sorted(gang.values(), key=lambda p: p.rank or 0)
        if p.phase == "Pending" and p.waiting_reason in IMAGE_PULL_REASONS
    ]


def image_pull_deadline(pods: Sequence[PodObservation], limits: Limits) -> Optional[datetime]:
    """When pods that cannot pull their image fail the job: the bound after the first was scheduled."""
    since = [at for p in pods if (at := p.scheduled_at or p.created_at) is not None]
    return min(since) + timedelta(seconds=limits.image_pull_seconds) if since else None


def pods_pending_too_long(
    job: DistributedTraining, gang: Mapping[int, PodObservation], now: datetime
) -> list[PodObservation]:
    """Pods of the current gang Pending for longer than scheduling.gang.scheduleTimeoutSeconds."""
    timeout = job.spec.scheduling.gang.schedule_timeout_seconds
    return [
        p
        for p in sorted(gang.values(), key=lambda p: p.rank or 0)
        if p.phase == "Pending" and p.created_at is not None and (now - p.created_at).total_seconds() > timeout
    ]


def _engine_message(observed: Observed) -> str:
    finished = [p for p in observed.engine_pods if p.phase in ("Failed", "Succeeded")]
    latest = max(finished, key=lambda p: p.created_at or datetime.min.replace(tzinfo=timezone.utc), default=None)
    if latest is not None and latest.message.strip():
        return _tail(latest.message)
    job = observed.engine_job
    return job.message if job is not None and job.message else ""


def _engine_results(observed: Observed) -> Optional[dict[str, Any]]:
    for pod in sorted(observed.engine_pods, key=lambda p: p.created_at or datetime.min.replace(tzinfo=timezone.utc)):
        if pod.phase == "Succeeded":
            results = termination_results(pod.message)
            if results is not None:
                return results
    return None


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
    conditions = _Conditions(status.conditions, now)
    never_accepted = status.accepted_spec is None
    if never_accepted:
        status.accepted_spec = immutable_spec(job.spec)
    if never_accepted and status.phase == "Failed":
        # It failed validation before anything was created (a job the operator accepted always
        # has an accepted spec); the spec has been fixed since.
        status = DistributedTrainingStatus(accepted_spec=immutable_spec(job.spec), progress=status.progress)
        conditions = _Conditions([], now)
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
        status.nodes = _node_counts(total, list(gang.values()), active=False, gone_succeeded=len(gone_succeeded))
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
        status.nodes = _node_counts(total, list(gang.values()), active=False)
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
        return _after_training(running_job, status, conditions, gang, observed, finish, now)

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
        status.nodes = _node_counts(total, [], active=True)
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

    status.nodes = _node_counts(total, list(gang.values()), active=True, gone_succeeded=len(gone_succeeded))
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


def _after_training(
    job: DistributedTraining,
    status: DistributedTrainingStatus,
    conditions: _Conditions,
    gang: Mapping[int, PodObservation],
    observed: Observed,
    finish: Callable[[Literal["Succeeded", "Failed"], str, str], DistributedTrainingStatus],
    now: datetime,
) -> DistributedTrainingStatus:
    """Training succeeded (rank 0 exited 0): the engine Job, or success."""
    spec = job.spec
    if not conditions.is_true(TRAINING_SUCCEEDED):
        results = termination_results(gang[0].message) if 0 in gang else None
        if results:
            status.artifacts = {**(status.artifacts or {}), **results}
        conditions.set(TRAINING_SUCCEEDED, True, "TrainerSucceeded", f"{worker_pod_name(job, 0)} exited 0")
        conditions.clear(PODS_PENDING, "TrainingSucceeded", "training is over")
    conditions.set(RUNNING, False, "TrainingSucceeded", "training is over")
    export_error = (status.artifacts or {}).get(contract.RESULTS_KEY_EXPORT_ERROR)
    if export_error:
        return _export_failed(job, conditions, str(export_error), finish)
    if not spec.engine.enabled:
        return finish("Succeeded", "TrainingSucceeded", "training succeeded (engine.enabled is false)")
    engine = observed.engine_job
    name = engine_job_name(job)
    if engine_pod_awaited(observed, now) is not None:
        engine = None
    if engine is not None and engine.succeeded:
        results = _engine_results(observed)
        if results:
            status.artifacts = {**(status.artifacts or {}), **results}
        conditions.set(ENGINE_BUILT, True, "EngineJobSucceeded", f"Job {name} built the TensorRT engine")
        return finish("Succeeded", "EngineBuilt", "training succeeded and the engine is built")
    if engine is not None and engine.failed:
        detail = _engine_message(observed) or engine.reason
        message = f"Job {name} failed" + (f": {detail}" if detail else "")
        conditions.set(ENGINE_BUILT, False, REASON_ENGINE_BUILD_FAILED, message)
        return finish("Failed", REASON_ENGINE_BUILD_FAILED, message)
    status.phase = "BuildingEngine"
    conditions.set(ENGINE_BUILT, False, "EngineBuilding", f"Job {name} is building the TensorRT engine")
    status.conditions = conditions.items()
    return status


def unreadable_status(
    read: DistributedTrainingStatus, problems: Sequence[str], now: datetime
) -> DistributedTrainingStatus:
    """The status as read, with a StatusUnreadable condition naming what the operator could not read.

    The operator does not act on a status it cannot read in full: it leaves the job's pods
    alone, and its own record of the job (trusted.py) stays as it was.
    """
    status = read.model_copy(deep=True)
    conditions = _Conditions(status.conditions, now)
    conditions.set(
        STATUS_UNREADABLE,
        True,
        REASON_UNREADABLE_STATUS,
        f"the operator cannot read {'; '.join(problems)}. It leaves the job's pods alone until it can: "
        "fix or remove what it names (kubectl patch --subresource=status)",
    )
    status.conditions = conditions.items()
    return status


def _export_failed(
    job: DistributedTraining,
    conditions: _Conditions,
    error: str,
    finish: Callable[[Literal["Succeeded", "Failed"], str, str], DistributedTrainingStatus],
) -> DistributedTrainingStatus:
    """Training succeeded and its checkpoints stay; model.onnx does not exist, so no engine can be built.

    No gang restart: training again would end in the same export."""
    conditions.set(EXPORT_FAILED, True, EXPORT_FAILED, error)
    if job.spec.engine.enabled:
        return finish(
            "Failed", EXPORT_FAILED, f"training succeeded but the ONNX export failed, so no engine is built: {error}"
        )
    return finish("Succeeded", "TrainingSucceeded", f"training succeeded; the ONNX export failed: {error}")


def invalid_status(
    previous: Optional[DistributedTrainingStatus], errors: Sequence[str], generation: Optional[int], now: datetime
) -> DistributedTrainingStatus:
    """Failed/InvalidSpec with the validation messages, for an object that does not validate.

    A job that was already accepted keeps running its accepted spec, so this applies only to
    objects the operator never accepted.
    """
    status = (previous or DistributedTrainingStatus()).model_copy(deep=True)
    conditions = _Conditions(status.conditions, now)
    message = "the spec is invalid: " + "; ".join(errors) + ". Fix the spec (see `dtrain validate`)"
    conditions.set(FAILED, True, REASON_INVALID_SPEC, message)
    status.phase = "Failed"
    status.observed_generation = generation
    if status.completion_time is None:
        status.completion_time = format_time(now)
    status.conditions = conditions.items()
    return status


# --- What is written, and what is said ---------------------------------------------------------------

# The status fields the operator owns; progress and lastCheckpoint belong to the trainer.
OWNED_FIELDS = (
    "phase",
    "conditions",
    "nodes",
    "nodesReady",
    "restarts",
    "startTime",
    "completionTime",
    "artifacts",
    "observedGeneration",
    "acceptedSpec",
)


def _owned(status: Optional[DistributedTrainingStatus]) -> dict[str, Any]:
    if status is None:
        return {}
    wire = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    return {k: wire[k] for k in OWNED_FIELDS if k in wire}


def status_patch(
    previous: Optional[DistributedTrainingStatus], new: DistributedTrainingStatus
) -> Optional[dict[str, Any]]:
    """The merge patch of `status` that turns `previous` into `new`, or None when nothing changed."""
    before, after = _owned(previous), _owned(new)
    patch: dict[str, Any] = {k: v for k, v in after.items() if before.get(k) != v}
    patch.update({k: None for k in before if k not in after})
    if "artifacts" in patch and isinstance(before.get("artifacts"), dict) and patch["artifacts"] is not None:
        # A merge patch merges maps: keys that disappeared must be nulled explicitly.
        patch["artifacts"] = {**{k: None for k in before["artifacts"] if k not in after["artifacts"]}, **after["artifacts"]}
    return patch or None


def only_counts_changed(patch: Mapping[str, Any]) -> bool:
    """True when a status patch changes nothing but node counts (worth batching, not urgent)."""
    return set(patch) <= {"nodes", "nodesReady"}


@dataclass(frozen=True)
class JobEvent:
    """A Kubernetes Event to post on the DistributedTraining."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    series: bool = False
    """Repeats of it are one Event with a count and a last-seen time (as Kubernetes' event series), not many."""


# Conditions that need the user: a Warning Event each time one turns True or says something new.
WARNING_CONDITIONS = (SPEC_IMMUTABLE, PODS_PENDING, STATUS_UNREADABLE, PODS_STUCK, IMAGE_PULL)


_PHASE_CONDITION = {
    "Running": RUNNING,
    "Exporting": RUNNING,
    "Restarting": RESTARTING,
    "BuildingEngine": ENGINE_BUILT,
    "Succeeded": SUCCEEDED,
    "Failed": FAILED,
    "Suspended": SUSPENDED,
}


def phase_message(status: DistributedTrainingStatus) -> str:
    """One line that says what the phase means for this job right now."""
    total = status.nodes.total if status.nodes else 0
    pulling = next((c for c in status.conditions if c.type == IMAGE_PULL and c.status == "True"), None)
    if status.phase in ("Pending", "Starting", "Restarting") and pulling is not None:
        return pulling.message
    if status.phase == "Pending":
        return f"waiting for {total} worker pod(s) to be created and scheduled"
    if status.phase == "Starting":
        return f"all {total} worker pod(s) are scheduled; their containers are starting"
    if status.phase == "Exporting":
        return "rank 0 is exporting the model to ONNX"
    condition_type = _PHASE_CONDITION.get(status.phase or "")
    condition = next((c for c in status.conditions if c.type == condition_type), None)
    return condition.message if condition is not None else ""


def status_events(
    previous: Optional[DistributedTrainingStatus], new: DistributedTrainingStatus
) -> list[JobEvent]:
    """Events for what changed: every phase change, and warnings that need the user."""
    events: list[JobEvent] = []
    old_phase = previous.phase if previous else None
    if new.phase != old_phase and new.phase is not None:
        kind: Literal["Normal", "Warning"] = "Warning" if new.phase in ("Failed", "Restarting") else "Normal"
        events.append(JobEvent(kind, new.phase, phase_message(new)))
    before = {c.type: c for c in (previous.conditions if previous else [])}
    for condition in new.conditions:
        if condition.type not in (*WARNING_CONDITIONS, stragglers.CONDITION) or condition.status != "True":
            continue
        old = before.get(condition.type)
        if old is None or old.status != "True" or old.message != condition.message:
            events.append(JobEvent("Warning", condition.type, condition.message, series=True))
    return events
