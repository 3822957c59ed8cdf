"""Restarting a gang in place (runPolicy.restartStrategy InPlace): the same pods, torchrun started again. Pure.

Every worker pod runs dtrain's supervisor around torchrun (dtrain_trainer.supervisor), which reports to
the operator (api.launches) and does what it is told. A restart in place goes:

1. the failure (a supervisor's report that torchrun exited, or the progress deadline) is decided as any
   other (core.policy); `strategy` says whether it can be made in place: every pod of the gang and its
   node still there and running, no failure that a new pod is for (an eviction, an OOM kill, a pod lost),
   every supervisor heard from lately;
2. the status takes the new gang generation with `inPlaceGeneration` set to it: the previous generation's
   pods are kept (not deleted), and `order` tells their supervisors to stop torchrun;
3. once every one of them says torchrun is gone (the barrier: no rank of the old launch can meet a rank
   of the new one), `pods_to_relabel` gives them the new generation's label, and `order` tells them to
   run it. torchrun's rendezvous meets the ranks again and the trainer resumes from the last checkpoint;
4. `gives_up` ends a restart in place that cannot finish (a pod failed, was deleted or cut off, or the
   stop takes longer than its grace period plus START_MARGIN_SECONDS): the pods are recreated instead,
   with no second count against backoffLimit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from dtrain_operator.api import FINISHED_PHASES, DistributedTraining, DistributedTrainingStatus, contract
from dtrain_operator.api.failure_rules import STRATEGY_IN_PLACE, STRATEGY_RECREATE, RestartStrategy
from dtrain_operator.api.launches import (
    ACTION_EXIT,
    ACTION_RUN,
    ACTION_STOP,
    ACTION_WAIT,
    REPORT_FRESH_SECONDS,
    STATE_EXITED,
    STATE_RUNNING,
    LaunchOrder,
)
from dtrain_operator.core import elastic, policy, progress_deadline
from dtrain_operator.core.observation import PodObservation, parse_time
from dtrain_operator.core.policy import FailureDecision, WorkerFailure

# What an in-place restart may take beyond the stop's grace period before the pods are recreated instead:
# the supervisors' next report (they are answered at once), torchrun's exit, the relabel.
START_MARGIN_SECONDS = 30.0
# Reasons whose cure is a new pod: the container's memory limit (its cgroup killed the trainer), the node.
RECREATE_REASONS = frozenset({"OOMKilled", "Evicted", "Preempted", "DeadlineExceeded"})


def restart_grace_seconds(
    job: DistributedTraining, status: DistributedTrainingStatus, workers: Sequence[PodObservation] = ()
) -> int | None:
    """How long the earlier gang's processes get after SIGTERM as the gang restarts: short for a hung gang and for
    the survivors of a worker whose pod vanished (`peer_vanished`), the progress deadline for the survivors of a
    failed worker, the pod's own (None) otherwise."""
    restarting = next((c for c in status.conditions if c.type == "Restarting" and c.status == "True"), None)
    if restarting is None:
        return None
    if restarting.reason == progress_deadline.REASON_PROGRESS_DEADLINE:
        return progress_deadline.HUNG_GANG_GRACE_SECONDS
    if restarting.reason == policy.REASON_WORKER_FAILED:
        if peer_vanished(job, status, workers):
            return progress_deadline.HUNG_GANG_GRACE_SECONDS
        return progress_deadline.survivors_grace_seconds(job.spec.run_policy, job.spec.termination_grace_period_seconds)
    return None


def peer_vanished(job: DistributedTraining, status: DistributedTrainingStatus, workers: Sequence[PodObservation]) -> bool:
    """A rank of the gang being replaced has no pod left, or one force-deleted while it ran (a lost node's, by the
    pod GC or by hand), while other ranks have theirs, and rank 0 is not writing a checkpoint. Such a peer's
    processes closed no connection: the survivors wait in a collective that never returns, cannot checkpoint on
    SIGTERM, and would hold the new gang back for the whole progress deadline. A survivor whose collective failed
    instead (its peer's connection closed) writes its checkpoint first, and rank 0 says so (stage checkpointing)."""
    replaced = status.gang_generation - 1
    ranks = {p.rank for p in workers if p.generation == replaced and p.rank is not None and not p.force_deleted}
    if not ranks or ranks >= set(range(elastic.gang_nodes(job.spec, status))):
        return False
    progress = status.progress
    return not (progress is not None and progress.gang_generation == replaced and progress.stage == contract.PROGRESS_STAGE_CHECKPOINTING)


def _stop_grace_seconds(job: DistributedTraining, status: DistributedTrainingStatus) -> int:
    return restart_grace_seconds(job, status) or job.spec.termination_grace_period_seconds


def _heard_lately(pod: PodObservation, now: datetime) -> bool:
    return pod.supervisor is not None and (now - pod.supervisor.received_at).total_seconds() <= REPORT_FRESH_SECONDS


def strategy(
    job: DistributedTraining,
    decision: FailureDecision,
    failures: Sequence[WorkerFailure],
    gang: Mapping[int, PodObservation],
    now: datetime,
    nodes: int | None = None,
) -> tuple[RestartStrategy, str]:
    """How a gang restart that `decision` made is carried out, and why: in place where it can be."""
    spec = job.spec
    if decision.count == "evictions":
        return STRATEGY_RECREATE, "Kueue evicted the gang: its pods give their quota back"
    if decision.strategy == STRATEGY_RECREATE:
        return STRATEGY_RECREATE, f"{decision.rule_name} says restartStrategy Recreate"
    if decision.strategy is None and spec.run_policy.restart_strategy == STRATEGY_RECREATE:
        return STRATEGY_RECREATE, "runPolicy.restartStrategy is Recreate"
    for failure in failures:
        if not failure.in_pod:
            return STRATEGY_RECREATE, f"worker {failure.rank}'s pod is gone or failed ({failure.reason})"
        if failure.reason in RECREATE_REASONS:
            return STRATEGY_RECREATE, f"worker {failure.rank} stopped with {failure.reason}: a new pod is the cure"
    for rank in range(nodes or spec.nodes):
        pod = gang.get(rank)
        if pod is None or pod.phase != "Running" or pod.deleting:
            return STRATEGY_RECREATE, f"worker {rank}'s pod is not running"
        if not _heard_lately(pod, now):
            return STRATEGY_RECREATE, (
                f"pod {pod.name}'s supervisor has not reported for over {REPORT_FRESH_SECONDS:g} s (cut off from "
                "the operator?)"
            )
    chosen = decision.rule_name if decision.strategy == STRATEGY_IN_PLACE else "runPolicy.restartStrategy"
    return STRATEGY_IN_PLACE, f"{chosen} is InPlace and every worker pod and its node are still there"


def kept_pods(status: DistributedTrainingStatus, workers: Sequence[PodObservation]) -> tuple[PodObservation, ...]:
    """The previous generation's pods that an in-place restart keeps (they get the new generation's label)."""
    generation = status.in_place_generation
    if generation is None or generation != status.gang_generation:
        return ()
    return tuple(p for p in workers if p.generation == generation - 1 and not p.deleting and p.rank is not None)


def _stopped(pod: PodObservation) -> bool:
    """Its supervisor says torchrun is no longer running (stopped on the order, or exited before it)."""
    return pod.supervisor is not None and pod.supervisor.report.state == STATE_EXITED


def pods_to_relabel(
    job: DistributedTraining, status: DistributedTrainingStatus, workers: Sequence[PodObservation]
) -> tuple[PodObservation, ...]:
    """The kept pods, once every one of them has stopped torchrun (the barrier); none before."""
    kept = kept_pods(status, workers)
    if sorted(p.rank for p in kept if p.rank is not None) != list(range(elastic.gang_nodes(job.spec, status))):
        return ()
    if any(p.generation == status.gang_generation for p in workers):
        return ()
    return kept if all(_stopped(p) and p.phase == "Running" for p in kept) else ()


def gives_up(
    job: DistributedTraining, status: DistributedTrainingStatus, workers: Sequence[PodObservation], now: datetime
) -> str | None:
    """Why an in-place restart still under way cannot finish (the pods are recreated instead); None: it goes on."""
    kept = {p.rank: p for p in kept_pods(status, workers)}
    for rank in range(elastic.gang_nodes(job.spec, status)):
        pod = kept.get(rank)
        if pod is None:
            return f"worker {rank}'s pod is gone"
        if pod.phase != "Running":
            return f"pod {pod.name} is {pod.phase} ({pod.reason or 'its supervisor exited'})"
        if not _heard_lately(pod, now):
            return f"pod {pod.name}'s supervisor has not reported for over {REPORT_FRESH_SECONDS:g} s (cut off?)"
    decided = parse_time(status.last_restart.time if status.last_restart else None)
    allowed = _stop_grace_seconds(job, status) + START_MARGIN_SECONDS
    if decided is not None and (now - decided).total_seconds() > allowed:
        waiting = sorted(p.name for p in kept.values() if not _stopped(p))
        return (
            f"torchrun did not stop within {allowed:g} s in {', '.join(waiting) or 'every pod'}"
            if waiting else f"the pods were not relabelled within {allowed:g} s"
        )
    return None


def seconds_until_give_up(
    job: DistributedTraining, status: DistributedTrainingStatus, workers: Sequence[PodObservation], now: datetime
) -> float | None:
    """When `gives_up` may next change its answer by the clock alone: the stop's allowance runs out, or a kept
    pod's supervisor goes unheard (a pod cut off sends nothing that would wake the operator)."""
    if not kept_pods_expected(status):
        return None
    decided = parse_time(status.last_restart.time if status.last_restart else None)
    if decided is None:
        return None
    allowed = _stop_grace_seconds(job, status) + START_MARGIN_SECONDS
    deadlines = [allowed - (now - decided).total_seconds()]
    deadlines += [
        REPORT_FRESH_SECONDS - (now - p.supervisor.received_at).total_seconds()
        for p in kept_pods(status, workers)
        if p.supervisor is not None
    ]
    return max(min(deadlines), 0.0) + 0.5


def kept_pods_expected(status: DistributedTrainingStatus) -> bool:
    """An in-place restart is under way: the new generation's pods are the previous one's, not relabelled yet."""
    return status.in_place_generation is not None and status.in_place_generation == status.gang_generation


def order(job: DistributedTraining, status: DistributedTrainingStatus, pod: PodObservation) -> LaunchOrder:
    """What `pod`'s supervisor does now, from the status the operator last computed and what it observes of the pod."""
    generation = pod.generation if pod.generation is not None else 0
    grace = _stop_grace_seconds(job, status)
    report = pod.supervisor.report if pod.supervisor is not None else None
    if status.phase in FINISHED_PHASES or status.phase == "Suspended":
        return LaunchOrder(action=ACTION_EXIT, generation=generation, grace_seconds=grace, why=f"the job is {status.phase}")
    current = status.gang_generation
    if generation == current:
        if report is not None and report.generation == generation and report.state == STATE_EXITED:
            return LaunchOrder(action=ACTION_WAIT, generation=generation, why="the operator decides on the exit")
        return LaunchOrder(action=ACTION_RUN, generation=generation)
    if kept_pods_expected(status) and generation == current - 1:
        if report is not None and report.state == STATE_RUNNING:
            return LaunchOrder(
                action=ACTION_STOP, generation=generation, grace_seconds=grace,
                why=f"the gang restarts in place as generation {current}",
            )
        return LaunchOrder(action=ACTION_WAIT, generation=generation, why="waiting for every pod's torchrun to stop")
    return LaunchOrder(
        action=ACTION_EXIT, generation=generation, grace_seconds=grace,
        why=f"this pod's generation {generation} is replaced by generation {current}",
    )


def relabel_patch(generation: int, pod_uid: str) -> dict[str, Any]:
    """The merge patch that moves a kept pod into gang generation `generation`. The uid is a precondition: a pod
    of the same name created since keeps its labels."""
    return {"metadata": {"uid": pod_uid, "labels": {contract.LABEL_GANG_GENERATION: str(generation)}}}
