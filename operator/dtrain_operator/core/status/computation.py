"""What the steps of `compute_status` (compute.py) share: the job, what is observed, the status being built."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from dtrain_operator.api import DistributedTraining, DistributedTrainingSpec, DistributedTrainingStatus, Phase
from dtrain_operator.core import elastic, policy, progress_deadline
from dtrain_operator.core.gang_state import node_counts
from dtrain_operator.core.observation import Limits, Observed, PodObservation, format_time
from dtrain_operator.core.policy import WorkerFailure
from dtrain_operator.core.status.conditions import (
    REASON_JOB_FINISHED,
    RESTARTING,
    RUNNING,
    Conditions,
)


@dataclass
class StatusComputation:
    """What the steps of `compute_status` share: its inputs, the status being built, and what earlier
    steps found. A step returns the finished status to end the computation, or None to go on."""

    job: DistributedTraining
    observed: Observed
    now: datetime
    spec_errors: Sequence[str]
    succeeded_ranks: Collection[int]
    limits: Limits
    progress_watch: progress_deadline.ProgressWatch | None
    status: DistributedTrainingStatus
    conditions: Conditions
    running_job: DistributedTraining = field(init=False)
    """The job with the spec it runs (core.accepted), set by the first step."""
    gang: dict[int, PodObservation] = field(default_factory=dict)
    previous_phase: Phase | None = None
    gang_started: bool = False
    gone_succeeded: set[int] = field(default_factory=set)
    """Ranks that exited 0 and whose pods are gone since: finished all the same."""
    training_done: bool = False
    accepted_now: bool = False
    """This computation records the accepted spec: the job is being created (or its spec, once invalid, was fixed)."""
    failures: list[WorkerFailure] = field(default_factory=list)

    @property
    def spec(self) -> DistributedTrainingSpec:
        return self.running_job.spec

    @property
    def total(self) -> int:
        return elastic.gang_nodes(self.spec, self.status)

    def done(self) -> DistributedTrainingStatus:
        self.status.conditions = self.conditions.items()
        return self.status

    def finish(self, ending: policy.Ending) -> DistributedTrainingStatus:
        status, conditions = self.status, self.conditions
        phase = status.phase = ending.phase
        conditions.set(phase, True, ending.reason, ending.message)
        conditions.clear(RUNNING, REASON_JOB_FINISHED, f"the job {phase.lower()}")
        conditions.clear(RESTARTING, REASON_JOB_FINISHED, f"the job {phase.lower()}")
        status.completion_time = format_time(self.now)
        self.count_nodes(list(self.gang.values()), active=False, gone_succeeded=len(self.gone_succeeded))
        return self.done()

    def count_nodes(self, pods: Sequence[PodObservation], active: bool, gone_succeeded: int = 0) -> None:
        self.status.nodes = node_counts(self.total, pods, active=active, gone_succeeded=gone_succeeded)
        wanted = f" of {self.spec.nodes}" if self.total < self.spec.nodes else ""
        self.status.nodes_ready = f"{self.status.nodes.running}/{self.total}{wanted}"
