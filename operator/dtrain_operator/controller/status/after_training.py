"""The status once rank 0 has exited 0: the trainer's results, a failed export, then the engine Job.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, Literal

from dtrain_operator.api import (
    DistributedTraining,
    DistributedTrainingStatus,
    contract,
)
from dtrain_operator.controller.status.conditions import (
    ENGINE_BUILT,
    EXPORT_FAILED,
    PODS_PENDING,
    REASON_ENGINE_BUILD_FAILED,
    RUNNING,
    TRAINING_SUCCEEDED,
    Conditions,
)
from dtrain_operator.controller.status.observe import termination_results
from dtrain_operator.core.gang_state import (
    engine_pod_awaited,
    message_tail,
)
from dtrain_operator.core.observation import Observed, PodObservation
from dtrain_operator.core.render import engine_job_name, worker_pod_name


def _engine_message(observed: Observed) -> str:
    finished = [p for p in observed.engine_pods if p.phase in ("Failed", "Succeeded")]
    latest = max(finished, key=lambda p: p.created_at or datetime.min.replace(tzinfo=timezone.utc), default=None)
    if latest is not None and latest.message.strip():
        return message_tail(latest.message)
    job = observed.engine_job
    return job.message if job is not None and job.message else ""


def _engine_results(observed: Observed) -> dict[str, Any] | None:
    for pod in sorted(observed.engine_pods, key=lambda p: p.created_at or datetime.min.replace(tzinfo=timezone.utc)):
        if pod.phase == "Succeeded":
            results = termination_results(pod.message)
            if results is not None:
                return results
    return None


def after_training(
    job: DistributedTraining,
    status: DistributedTrainingStatus,
    conditions: Conditions,
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


def _export_failed(
    job: DistributedTraining,
    conditions: Conditions,
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
