"""The status once rank 0 has exited 0: the trainer's results, a failed export, then the engine Job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from dtrain_operator.api import (
    DistributedTraining,
    DistributedTrainingStatus,
    contract,
)
from dtrain_operator.api.results import EngineResults, TrainerResults
from dtrain_operator.core import policy
from dtrain_operator.core.child_names import engine_job_name, worker_pod_name
from dtrain_operator.core.gang_state import engine_pod_awaited
from dtrain_operator.core.observation import Observed, PodObservation
from dtrain_operator.core.status.conditions import (
    ENGINE_BUILT,
    EXPORT_FAILED,
    PODS_PENDING,
    REASON_ENGINE_BUILDING,
    REASON_ENGINE_JOB_SUCCEEDED,
    REASON_TRAINER_SUCCEEDED,
    RUNNING,
    TRAINING_SUCCEEDED,
    Conditions,
)
from dtrain_operator.core.status.observe import termination_results


def _engine_message(observed: Observed) -> str:
    finished = [p for p in observed.engine_pods if p.phase in ("Failed", "Succeeded")]
    latest = max(finished, key=lambda p: p.created_at or datetime.min.replace(tzinfo=timezone.utc), default=None)
    if latest is not None and latest.message.strip():
        return policy.message_tail(latest.message)
    job = observed.engine_job
    return job.message if job is not None and job.message else ""


def _engine_results(observed: Observed) -> dict[str, Any] | None:
    for pod in sorted(observed.engine_pods, key=lambda p: p.created_at or datetime.min.replace(tzinfo=timezone.utc)):
        if pod.phase == "Succeeded":
            results = EngineResults.read(termination_results(pod.message))
            if results is not None:
                return results.to_wire()
    return None


def _trainer_results(gang: Mapping[int, PodObservation]) -> dict[str, Any] | None:
    """Rank 0's results, the fields TrainerResults knows and no other: status.artifacts has a fixed schema, whatever
    the job's code wrote into its termination message."""
    results = TrainerResults.read(termination_results(gang[0].message)) if 0 in gang else None
    return results.to_wire() if results is not None else None


def after_training(
    job: DistributedTraining,
    status: DistributedTrainingStatus,
    conditions: Conditions,
    gang: Mapping[int, PodObservation],
    observed: Observed,
    finish: Callable[[policy.Ending], DistributedTrainingStatus],
    now: datetime,
) -> DistributedTrainingStatus:
    """Training succeeded (rank 0 exited 0): the engine Job, or success."""
    spec = job.spec
    if not conditions.is_true(TRAINING_SUCCEEDED):
        results = _trainer_results(gang)
        if results:
            status.artifacts = {**(status.artifacts or {}), **results}
        name = gang[0].name if 0 in gang else worker_pod_name(job, 0)
        conditions.set(TRAINING_SUCCEEDED, True, REASON_TRAINER_SUCCEEDED, f"{name} exited 0")
        conditions.clear(PODS_PENDING, policy.REASON_TRAINING_SUCCEEDED, "training is over")
    conditions.set(RUNNING, False, policy.REASON_TRAINING_SUCCEEDED, "training is over")
    export_error = (status.artifacts or {}).get(contract.RESULTS_KEY_EXPORT_ERROR)
    if export_error:
        conditions.set(EXPORT_FAILED, True, EXPORT_FAILED, str(export_error))
    ending = policy.ending_after_training(str(export_error) if export_error else None, spec.engine.enabled)
    if ending is not None:
        return finish(ending)
    engine = observed.engine_job
    name = engine_job_name(job)
    if engine_pod_awaited(observed, now) is not None:
        engine = None
    if engine is not None and engine.succeeded:
        results = _engine_results(observed)
        if results:
            status.artifacts = {**(status.artifacts or {}), **results}
        conditions.set(ENGINE_BUILT, True, REASON_ENGINE_JOB_SUCCEEDED, f"Job {name} built the TensorRT engine")
        return finish(policy.engine_ending(built=True, builder=f"Job {name}"))
    if engine is not None and engine.failed:
        ending = policy.engine_ending(built=False, builder=f"Job {name}", detail=_engine_message(observed) or engine.reason)
        conditions.set(ENGINE_BUILT, False, ending.reason, ending.message)
        return finish(ending)
    status.phase = "BuildingEngine"
    conditions.set(ENGINE_BUILT, False, REASON_ENGINE_BUILDING, f"Job {name} is building the TensorRT engine")
    status.conditions = conditions.items()
    return status

