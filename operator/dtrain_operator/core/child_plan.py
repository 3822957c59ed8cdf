"""Which children to create and delete, from the status just computed and what is observed. Pure.

The operator writes the status first and then carries out the plan, so that an operator killed
at any moment finds the decision in the status and carries it out again: pods of older gang
generations are deleted, missing pods of the current generation created, nothing twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from dtrain_operator.api import FINISHED_PHASES, DistributedTraining, DistributedTrainingStatus, contract
from dtrain_operator.core import elastic, in_place, queueing
from dtrain_operator.core.child_names import standby_pod_name, worker_pod_name
from dtrain_operator.core.gang_state import (
    current_gang,
    engine_pod_awaited,
    image_pull_deadline,
    pulling_images,
    stuck_terminating,
)
from dtrain_operator.core.observation import EngineJobObservation, Limits, Observed, PodObservation, parse_time

# Phases in which the current gang's missing pods are created.
CREATING_PHASES = ("Pending", "Starting", "Restarting")
# Phases in which deadlines and pending timeouts are watched.
ACTIVE_PHASES = ("Pending", "Starting", "Running", "Restarting", "Exporting", "BuildingEngine")


@dataclass(frozen=True)
class Plan:
    """What the operator does after writing the status."""

    create_ranks: tuple[int, ...] = ()
    """Worker pods of the current gang generation to create (the Service is ensured first)."""
    delete_pods: tuple[PodObservation, ...] = ()
    """Worker pods to delete (older generations, a suspended gang, cleanPodPolicy)."""
    force_delete_pods: tuple[PodObservation, ...] = ()
    """Pods stuck terminating on a node that stopped reporting: deleted with no grace period."""
    create_engine_job: bool = False
    delete_engine_job: EngineJobObservation | None = None
    delete_job: bool = False
    """ttlSecondsAfterFinished has passed: delete the DistributedTraining itself."""
    requeue_after: float | None = None
    """Seconds until a deadline, timeout or TTL needs another look."""
    delete_grace_seconds: int | None = None
    """Grace period of the deletions (None: each pod's own): short for a gang restarted for a hang."""
    relabel_pods: tuple[PodObservation, ...] = ()
    """An in-place restart's pods, every supervisor's torchrun stopped: they take the new gang generation's label."""
    gang_nodes: int | None = None
    """The gang's size that the created worker pods' launch environment names (an elastic gang's now)."""
    create_standby_ranks: tuple[int, ...] = ()
    """Standby pods to create: one for each node a smaller elastic gang lacks (core.elastic)."""
    let_go_pods: tuple[PodObservation, ...] = ()
    """A queued job that ended: its pods, to be marked the last of their Kueue group (core.queueing.pods_to_let_go)."""


# Requeue a hair past a deadline, so that the next look sees it passed.
REQUEUE_MARGIN_SECONDS = 0.1


def _seconds_until(moment: datetime, now: datetime) -> float:
    return max((moment - now).total_seconds(), 0.0) + REQUEUE_MARGIN_SECONDS


def _earliest(*delays: float | None) -> float | None:
    present = [d for d in delays if d is not None]
    return min(present) if present else None


def _finished_cleanup(
    job: DistributedTraining, workers: tuple[PodObservation, ...], observed: Observed
) -> tuple[tuple[PodObservation, ...], EngineJobObservation | None]:
    policy = job.spec.run_policy.clean_pod_policy
    engine = observed.engine_job
    live_engine = engine if engine is not None and not engine.deleting else None
    if policy == "All":
        return tuple(p for p in workers if not p.deleting), live_engine
    if policy == "Running":
        still_running = tuple(p for p in workers if not p.deleting and p.phase in ("Pending", "Running", "Unknown"))
        return still_running, live_engine if live_engine is not None and not live_engine.finished else None
    return (), None


def _stuck(
    workers: tuple[PodObservation, ...], now: datetime, limits: Limits
) -> tuple[tuple[PodObservation, ...], float | None]:
    """Stuck pods to force-delete (their node stopped reporting), and when the next one will be stuck."""
    stuck = stuck_terminating(workers, now, limits)
    force = tuple(p for p in stuck if not p.ready)
    waiting = [
        _seconds_until(p.grace_ends_at + timedelta(seconds=limits.stuck_terminating_seconds), now)
        for p in workers
        if p.deleting and p.grace_ends_at is not None and p not in stuck
    ]
    return force, min(waiting, default=None)


def _finished_plan(
    job: DistributedTraining, status: DistributedTrainingStatus, workers: tuple[PodObservation, ...],
    older: tuple[PodObservation, ...], observed: Observed, now: datetime,
) -> Plan:
    """A finished job: runPolicy.cleanPodPolicy's deletions, and the job itself after its TTL."""
    if status.accepted_spec is None:
        deletions: tuple[PodObservation, ...] = ()
        engine_deletion = None
    else:
        deletions, engine_deletion = _finished_cleanup(job, workers, observed)
        deletions = tuple({p.uid: p for p in older + deletions}.values())
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    completed = parse_time(status.completion_time)
    expiry = completed + timedelta(seconds=ttl) if ttl is not None and completed is not None else None
    expired = expiry is not None and expiry <= now
    return Plan(
        delete_pods=deletions,
        delete_engine_job=engine_deletion,
        delete_job=expired,
        requeue_after=None if expiry is None or expired else _seconds_until(expiry, now),
        let_go_pods=queueing.pods_to_let_go(job, workers),
    )


def _next_look(
    job: DistributedTraining, status: DistributedTrainingStatus, gang: Mapping[int, PodObservation],
    observed: Observed, now: datetime, limits: Limits,
) -> float | None:
    """Seconds until the active deadline, a pending timeout, an image pull deadline or an awaited engine pod."""
    spec, phase = job.spec, status.phase
    deadline = None
    started = parse_time(status.start_time)
    if spec.run_policy.active_deadline_seconds is not None and started is not None and phase in ACTIVE_PHASES:
        deadline = _seconds_until(started + timedelta(seconds=spec.run_policy.active_deadline_seconds), now)
    timeout = timedelta(seconds=spec.scheduling.gang.schedule_timeout_seconds)
    pending_checks = [
        _seconds_until(p.created_at + timeout, now)
        for p in gang.values()
        if p.phase == "Pending" and p.created_at is not None and p.created_at + timeout > now
    ]
    unplaced = elastic.seconds_until_unplaced(gang, spec.elastic.wait_seconds, now) if spec.elastic else None
    awaited = engine_pod_awaited(observed, now)
    pull_deadline = image_pull_deadline(pulling_images(gang), limits) if phase in CREATING_PHASES else None
    return _earliest(
        deadline,
        None if pull_deadline is None else _seconds_until(pull_deadline, now),
        min(pending_checks, default=None),
        None if unplaced is None else unplaced + REQUEUE_MARGIN_SECONDS,
        None if awaited is None else awaited + REQUEUE_MARGIN_SECONDS,
        in_place.seconds_until_give_up(job, status, observed.workers, now),
    )


def _earlier_gang_alive(status: DistributedTrainingStatus, workers: Sequence[PodObservation]) -> bool:
    """Whether a pod of an earlier gang may still run: not failed, and not deleted before it was ever placed.

    A new gang waits for it, as a gang is all or nothing. A new rank beside an old one finds it under the
    same name (a headless Service publishes a terminating pod's address) and joins the old gang's
    rendezvous, whose next collective fails: a node loss failed a job so. And Kueue counts such a pod in
    the job's pod group (its isPodRunnableOrSucceeded) and deletes a new one beside it as an excess member.
    A failed pod that Kueue's finalizer keeps does not hold the new gang back (Kueue lets it go only once
    a new pod replaces it)."""
    return any(
        p.generation != status.gang_generation and p.phase != "Failed" and not (p.deleting and not p.scheduled)
        for p in workers
    )


def plan_children(
    job: DistributedTraining,
    status: DistributedTrainingStatus,
    observed: Observed,
    now: datetime,
    limits: Limits = Limits(),
) -> Plan:
    """The children to create and delete for `job` (the spec it runs) in `status` (just computed)."""
    workers = tuple(p for p in observed.workers if p.role == contract.ROLE_WORKER)
    force, stuck_check = _stuck(workers, now, limits)
    gang = current_gang(status, workers)
    kept = in_place.kept_pods(status, workers)
    older = tuple(
        p for p in workers if p.generation != status.gang_generation and not p.deleting and p not in kept
    )
    phase = status.phase
    standby = tuple(p for p in observed.standby if not p.deleting)
    if phase in FINISHED_PHASES:
        finished = _finished_plan(job, status, workers, older, observed, now)
        return dataclasses.replace(finished, delete_pods=finished.delete_pods + standby)
    if phase == "Suspended":
        return Plan(
            delete_pods=tuple(p for p in workers if not p.deleting) + standby, force_delete_pods=force,
            requeue_after=stuck_check,
        )
    nodes = elastic.gang_nodes(job.spec, status)
    # Standby pods ask only for what the whole gang leaves free: none before each of its pods is placed (one
    # placed first would take a node the gang needs). Under Kueue a gang's size is the workload it admitted.
    gang_placed = all(rank in gang and gang[rank].scheduled for rank in range(nodes))
    queued = queueing.queue_name(job) is not None
    lacking = elastic.standby_ranks(job.spec, status) if gang_placed and not queued else range(0)
    standing = {p.name for p in standby}
    occupied = {p.name for p in workers}
    create: tuple[int, ...] = ()
    if phase in CREATING_PHASES and not kept and not _earlier_gang_alive(status, workers):
        create = tuple(
            rank for rank in range(nodes)
            if rank not in gang and worker_pod_name(job, rank, status.gang_generation) not in occupied
        )
    return Plan(
        create_ranks=create,
        gang_nodes=nodes,
        create_standby_ranks=tuple(r for r in lacking if standby_pod_name(job, r) not in standing),
        delete_pods=older + tuple(p for p in standby if p.rank not in lacking),
        force_delete_pods=force,
        delete_grace_seconds=in_place.restart_grace_seconds(job, status, workers) if older else None,
        relabel_pods=in_place.pods_to_relabel(job, status, workers),
        create_engine_job=phase == "BuildingEngine" and observed.engine_job is None,
        requeue_after=_earliest(stuck_check, _next_look(job, status, gang, observed, now, limits)),
    )
