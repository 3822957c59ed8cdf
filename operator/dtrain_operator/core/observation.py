"""What the operator observes of a job's children, as typed values: its pods, its engine Job, and the
limits on how long it waits on the cluster. Made by core.status.observe from the API server's objects.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from dtrain_operator.api.launches import LaunchReport

# A job by its namespace and name: how the operator keys its caches, its queue and its Events.
JobKey = tuple[str, str]


@dataclass(frozen=True)
class QueueObservation:
    """Kueue's view of the job's pod group: its Workload and the queues it waits in."""

    local_queue: str
    cluster_queue: str = ""
    message: str = ""
    """Why the Workload is not admitted (its QuotaReserved condition's message), when it is not."""


@dataclass(frozen=True)
class SupervisorState:
    """The latest report of a pod's supervisor (api.launches) and when the operator received it."""

    report: LaunchReport
    received_at: datetime


@dataclass(frozen=True)
class PodObservation:
    """The little the operator needs to know about one of a job's pods (worker or engine)."""

    name: str
    uid: str
    resource_version: str
    role: str
    rank: int | None
    generation: int | None
    phase: str
    deleting: bool = False
    created_at: datetime | None = None
    scheduled: bool = False
    pending_reason: str = ""
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    # True when the pod did not exit by itself: evicted, preempted, its node lost.
    lost: bool = False
    owner_uid: str | None = None
    finished_at: datetime | None = None
    grace_ends_at: datetime | None = None
    """metadata.deletionTimestamp of a pod being deleted: the API server sets it to the time of the delete
    request plus the grace period (deletionGracePeriodSeconds), when the kubelet kills what is left."""
    force_deleted: bool = False
    """Deleted with no grace period while it ran (a lost node's pod, by the pod GC or by hand): nothing waits for its
    processes to end, and they may run on, cut off."""
    ready: bool = False
    waiting_reason: str = ""
    """The trainer container's waiting reason (ErrImagePull, ImagePullBackOff, ContainerCreating, ...)."""
    scheduled_at: datetime | None = None
    queued: bool = False
    """Held by Kueue's admission gate: its group is not admitted yet."""
    kueue_managed: bool = False
    """Taken in by Kueue's pod webhook (its managed label): Kueue will admit or evict it."""
    last_in_group: bool = False
    """Marked the last of its Kueue pod group (a job that ended: core.queueing.pods_to_let_go)."""
    node: str = ""
    """The Kubernetes node it is bound to (spec.nodeName)."""
    supervisor: SupervisorState | None = None
    """What its supervisor last reported (worker pods; None before its first report)."""


@dataclass(frozen=True)
class Limits:
    """How long the operator waits on the cluster before it says so and acts (the operator's flags)."""

    stuck_terminating_seconds: float = 150.0
    """A deleted pod still there this long after its grace period ended is stuck (its node may be gone)."""
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
    owner_uid: str | None = None
    finished_at: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.succeeded or self.failed


@dataclass(frozen=True)
class Observed:
    """Everything observed about one job's children."""

    workers: tuple[PodObservation, ...] = ()
    standby: tuple[PodObservation, ...] = ()
    """An elastic gang's standby pods (contract.ROLE_STANDBY)."""
    engine_pods: tuple[PodObservation, ...] = ()
    engine_job: EngineJobObservation | None = None
    queue: QueueObservation | None = None
    """Kueue's Workload for the workers, for a job in a LocalQueue (read only while they are queued)."""


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def format_time(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
