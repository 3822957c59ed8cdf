"""An export that fails after a successful training: no gang restart, an ExportFailed condition, the reason kept."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from dtrain_operator.api import DistributedTraining, DistributedTrainingStatus, contract, immutable_spec
from dtrain_operator.controller.status.compute import compute_status
from dtrain_operator.controller.status.conditions import EXPORT_FAILED
from dtrain_operator.core.observation import Observed, PodObservation, format_time

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
EARLIER = NOW - timedelta(minutes=10)
UID = "0b8e1f9e-7c44-4c1f-a2b6-1d7e3f6f2a11"
EXPORT_ERROR = "torch.onnx.export failed with inputs (input int64[7]) (RuntimeError: unsupported op)"


def job_with(engine: bool) -> DistributedTraining:
    return DistributedTraining.model_validate(
        {"apiVersion": contract.API_VERSION, "kind": contract.KIND,
         "metadata": {"name": "text", "namespace": "ml", "uid": UID, "generation": 1},
         "spec": {"nodes": 2, "accelerator": "cpu", "engine": {"enabled": engine}}}
    )


def succeeded_worker(rank: int, message: str = "") -> PodObservation:
    return PodObservation(
        name=f"text-{rank}", uid=f"uid-{rank}", resource_version="1", role=contract.ROLE_WORKER, rank=rank,
        generation=0, phase="Succeeded", created_at=EARLIER, scheduled=True, owner_uid=UID, exit_code=0,
        message=message,
    )


@pytest.mark.parametrize(
    ("engine", "phase", "reason"),
    [(False, "Succeeded", "TrainingSucceeded"), (True, "Failed", EXPORT_FAILED)],
    ids=["no-engine", "engine-asked"],
)
def test_training_succeeded_the_export_failed(engine: bool, phase: str, reason: str) -> None:
    job = job_with(engine)
    results: dict[str, Any] = {"ok": True, "step": 40, "loss": 0.3, contract.RESULTS_KEY_EXPORT_ERROR: EXPORT_ERROR}
    observed = Observed(workers=(succeeded_worker(0, json.dumps(results)), succeeded_worker(1)))
    previous = DistributedTrainingStatus.model_validate(
        {"phase": "Running", "restarts": 0, "startTime": format_time(EARLIER), "acceptedSpec": immutable_spec(job.spec)}
    )
    status = compute_status(job, observed, previous, NOW)
    assert (status.phase, status.restarts) == (phase, 0)
    conditions = {c.type: c for c in status.conditions}
    assert conditions["TrainingSucceeded"].status == "True"
    assert (conditions[EXPORT_FAILED].status, conditions[EXPORT_FAILED].message) == ("True", EXPORT_ERROR)
    assert conditions[phase].reason == reason and EXPORT_ERROR in conditions[phase].message
