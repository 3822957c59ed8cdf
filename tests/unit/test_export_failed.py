"""An export that fails after a successful training: no gang restart, an ExportFailed condition, the reason kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dtrain_operator.api import contract
from dtrain_operator.core.observation import Observed
from dtrain_operator.core.status.compute import compute_status
from dtrain_operator.core.status.conditions import EXPORT_FAILED
from tests.builders import NOW, a_cpu_job, a_worker, accepted_status

EXPORT_ERROR = "torch.onnx.export failed with inputs (input int64[7]) (RuntimeError: unsupported op)"


@pytest.mark.parametrize(
    ("engine", "phase", "reason"),
    [(False, "Succeeded", "TrainingSucceeded"), (True, "Failed", EXPORT_FAILED)],
    ids=["no-engine", "engine-asked"],
)
def test_training_succeeded_the_export_failed(engine: bool, phase: str, reason: str) -> None:
    job = a_cpu_job("text").in_namespace("ml").with_uid().at_generation(1).with_engine(engine).as_model()
    results: dict[str, Any] = {"ok": True, "step": 40, "loss": 0.3, contract.RESULTS_KEY_EXPORT_ERROR: EXPORT_ERROR}
    observed = Observed(workers=(
        a_worker(0, "Succeeded", job="text", exit_code=0, message=json.dumps(results)),
        a_worker(1, "Succeeded", job="text", exit_code=0),
    ))
    status = compute_status(job, observed, accepted_status(job), NOW)
    assert (status.phase, status.restarts) == (phase, 0)
    conditions = {c.type: c for c in status.conditions}
    assert conditions["TrainingSucceeded"].status == "True"
    assert (conditions[EXPORT_FAILED].status, conditions[EXPORT_FAILED].message) == ("True", EXPORT_ERROR)
    assert conditions[phase].reason == reason and EXPORT_ERROR in conditions[phase].message
