"""The chart's ValidatingAdmissionPolicy for trainer tokens, evaluated by a real CEL engine (admission.py).

RBAC cannot say "only these fields" or "only your own job": a Role grants `patch` on
distributedtrainings/status for the whole namespace. The policy says the rest, in CEL.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.chart import admission

NAMESPACE = "team-a"
TRAINER = f"system:serviceaccount:{NAMESPACE}:dtrain-trainer"
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"


def policy() -> dict[str, Any]:
    return admission.chart_policy("trainer")


def admit(request: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> tuple[bool, list[str]]:
    """(allowed, messages) as the API server decides for one UPDATE of distributedtrainings/status."""
    return admission.admit(policy(), request, old, new)


def job(name: str = "resnet", **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "dtrain.dev/v1alpha1",
        "kind": "DistributedTraining",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"nodes": 2, "image": "dtrain-trainer:1"},
        "status": {"phase": "Running", "restarts": 1, "progress": {"step": 10}, **status},
    }


def request(user: str = TRAINER, pod: str | None = "resnet-0") -> dict[str, Any]:
    extra = {POD_NAME_KEY: [pod], "authentication.kubernetes.io/pod-uid": ["0b3c"]} if pod else {}
    return {
        "namespace": NAMESPACE,
        "operation": "UPDATE",
        "subResource": "status",
        "userInfo": {"username": user, "groups": ["system:serviceaccounts"], "extra": extra},
    }


def with_status(obj: dict[str, Any], **changes: Any) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    new["status"].update(changes)
    return new


def test_every_expression_compiles():
    admission.compile_all(policy())


def test_rank_zero_reports_progress_and_checkpoint():
    old = job()
    new = with_status(
        old,
        progress={"step": 20, "loss": 0.5},
        lastCheckpoint={"step": 20, "path": "/ckpt"},
        preflight={"passed": True},
    )
    assert admit(request(), old, new) == (True, [])


def test_first_report_of_a_job_without_progress():
    old = job()
    del old["status"]["progress"]
    assert admit(request(), old, with_status(old, progress={"step": 1}))[0]


@pytest.mark.parametrize(
    "change",
    [
        {"restarts": 0},
        {"phase": "Succeeded"},
        {"acceptedSpec": {"image": "attacker/evil:1"}},
        {"conditions": []},
        {"artifacts": {"onnx": "/evil.onnx"}},
    ],
    ids=lambda change: next(iter(change)),
)
def test_the_trainer_token_cannot_change_anything_else(change):
    old = job()
    allowed, messages = admit(request(), old, with_status(old, **change))
    assert not allowed
    assert messages == ["a trainer may change only status.progress, status.lastCheckpoint and status.preflight"]


def test_the_trainer_token_cannot_remove_fields():
    old = job()
    new = copy.deepcopy(old)
    del new["status"]["restarts"]
    allowed, messages = admit(request(), old, new)
    assert not allowed and "may not remove" in messages[0]


def test_another_jobs_status_is_out_of_reach():
    old = job("other-job")
    allowed, messages = admit(request(pod="resnet-0"), old, with_status(old, progress={"step": 99}))
    assert not allowed and messages == ["a trainer may report only the status of its own job, from its rank-0 pod"]


@pytest.mark.parametrize("pod", ["resnet-1", None], ids=["rank-1-pod", "token-not-bound-to-a-pod"])
def test_only_the_rank_zero_pod_may_report(pod):
    old = job()
    assert not admit(request(pod=pod), old, with_status(old, progress={"step": 11}))[0]


def test_the_operator_is_not_matched():
    old = job()
    operator = request(user="system:serviceaccount:dtrain-system:dtrain-operator", pod=None)
    assert admit(operator, old, with_status(old, restarts=2, phase="Restarting")) == (True, [])


def test_the_policy_is_bound_and_denies():
    binding = admission.chart_policy("trainer", "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy()["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy()["spec"]["failurePolicy"] == "Fail"
