"""What the observed pods say about the current gang: which pods are in it, which failed, which are stuck,
waiting on an image or pending too long, and whether a finished engine Job's pod is still awaited. Pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta

from dtrain_operator.api import (
    DistributedTraining,
    DistributedTrainingStatus,
    NodeCounts,
    Progress,
    contract,
    launches,
)
from dtrain_operator.core import queueing
from dtrain_operator.core.child_names import worker_pod_name
from dtrain_operator.core.observation import Limits, Observed, PodObservation, parse_time
from dtrain_operator.core.policy import WorkerFailure

# The kubelet's waiting reasons of a container whose image cannot be pulled (they alternate
# while it backs off: ErrImagePull, ImagePullBackOff, ErrImagePull, ...).
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
)
# The reasons of Kubernetes' DisruptionTarget condition: who is deleting a pod (failure rules may name them).
DISRUPTION_REASONS = frozenset(
    {"PreemptionByScheduler", "EvictionByEvictionAPI", "DeletionByTaintManager", "DeletionByPodGC", "TerminationByKubelet"}
)
# How long a finished engine Job waits for its pod to be seen (see engine_pod_awaited).
ENGINE_POD_GRACE_SECONDS = 30.0


def engine_pod_awaited(observed: Observed, now: datetime) -> float | None:
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


def node_counts(total: int, pods: Sequence[PodObservation], active: bool, gone_succeeded: int = 0) -> NodeCounts:
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
        if p.generation == status.gang_generation and p.rank is not None and p.role == contract.ROLE_WORKER
    }


def worker_failures(
    job: DistributedTraining,
    gang: Mapping[int, PodObservation],
    gang_started: bool,
    succeeded_ranks: Collection[int] = (),
    nodes: int | None = None,
) -> list[WorkerFailure]:
    """Workers of the current gang that failed, were lost, or vanished.

    A missing pod is a failure only once the whole gang has run (`gang_started`): before that it
    is simply not created yet. Once the gang runs, a pod being deleted is a failure because the
    operator deletes pods of a running gang only when it stops the job, and then it asks no more
    questions; before, `compute_status` leaves pods on their way out out of the gang. A rank
    that exited 0 (`succeeded_ranks`) stays finished when its pod goes (drained, collected). `nodes`: the
    gang's size (an elastic gang's now; default spec.nodes).
    """
    failures: list[WorkerFailure] = []
    for rank in range(nodes or job.spec.nodes):
        pod = gang.get(rank)
        if pod is None:
            if gang_started and rank not in succeeded_ranks:
                name = worker_pod_name(job, rank)
                failures.append(WorkerFailure(rank, None, "Deleted", f"pod {name} was deleted"))
        elif pod.phase == "Failed":
            failures.append(
                WorkerFailure(rank, pod.exit_code, pod.reason or "Error", pod.message, pod.finished_at)
            )
        elif (exited := exited_in_pod(pod)) is not None:
            failures.append(exited)
        elif pod.deleting and pod.phase != "Succeeded":
            if queueing.is_queue_stop(pod.reason):
                failures.append(WorkerFailure(rank, None, pod.reason, pod.message or f"Kueue stopped pod {pod.name}"))
            elif pod.reason in DISRUPTION_REASONS:
                failures.append(WorkerFailure(rank, None, pod.reason, pod.message or f"pod {pod.name} is being deleted"))
            else:
                failures.append(WorkerFailure(rank, None, "Deleted", f"pod {pod.name} is being deleted"))
    return failures


def exited_in_pod(pod: PodObservation) -> WorkerFailure | None:
    """The failure a running pod's supervisor reported: its torchrun of this generation exited by itself, not 0."""
    state = pod.supervisor
    if state is None or pod.phase != "Running" or pod.deleting or pod.rank is None:
        return None
    report = state.report
    if report.generation != pod.generation or report.state != launches.STATE_EXITED or report.stopped_on_order:
        return None
    if report.exit_code == 0:
        return None
    return WorkerFailure(
        pod.rank,
        report.exit_code,
        report.reason or "Error",
        report.message or "",
        state.received_at,
        in_pod=True,
    )


# Kubernetes' timestamps have a resolution of one second: a report counts for the gang only when
# it came at least this long after the gang's rank-0 pod was created.
REPORT_AFTER_CREATION_SECONDS = 1.0


def reported_stage(progress: Progress | None, gang: Mapping[int, PodObservation]) -> str | None:
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
    """Worker pods still there limits.stuck_terminating_seconds after their grace period ended."""
    return sorted(
        (
            p
            for p in workers
            if p.deleting
            and p.grace_ends_at is not None
            and (now - p.grace_ends_at).total_seconds() >= limits.stuck_terminating_seconds
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


def image_pull_deadline(pods: Sequence[PodObservation], limits: Limits) -> datetime | None:
    """When pods that cannot pull their image fail the job: the bound after the first was scheduled."""
    since = [at for p in pods if (at := p.scheduled_at or p.created_at) is not None]
    return min(since) + timedelta(seconds=limits.image_pull_seconds) if since else None


def pods_pending_too_long(
    job: DistributedTraining, gang: Mapping[int, PodObservation], now: datetime
) -> list[PodObservation]:
    """Pods of the current gang Pending for longer than scheduling.gang.scheduleTimeoutSeconds (a pod Kueue holds
    is queued, not stuck: the Queued condition says so)."""
    timeout = job.spec.scheduling.gang.schedule_timeout_seconds
    return [
        p
        for p in sorted(gang.values(), key=lambda p: p.rank or 0)
        if p.phase == "Pending" and not p.queued and p.created_at is not None
        and (now - p.created_at).total_seconds() > timeout
    ]


def succeeded_ranks(
    status: DistributedTrainingStatus, observed: Observed, earlier: Collection[int] = (), earlier_generation: int | None = None
) -> frozenset[int]:
    """Ranks of the current gang that exited 0 (status.succeededRanks): those seen Succeeded
    while the gang ran, and those recorded earlier for the same generation. A suspend forgets
    them (the resumed gang runs every rank again)."""
    if status.phase == "Suspended":
        return frozenset()
    kept = frozenset(earlier) if earlier_generation == status.gang_generation else frozenset()
    if status.phase not in ("Running", "Exporting", "BuildingEngine", "Succeeded"):
        return kept
    seen = {p.rank for p in current_gang(status, observed.workers).values() if p.phase == "Succeeded"}
    return kept | {rank for rank in seen if rank is not None}
