"""Parity: each CEL rule of the CRD, run by kube-apiserver, and the pydantic validator that says the same thing
agree on every case, so that the API server and the operator refuse the same specs (the rules themselves:
test_crd_cel.py)."""

from __future__ import annotations

import itertools

import pydantic
import pytest

from dtrain_operator import api
from dtrain_operator.api import contract
from tests.kube_admission import KubeAdmission
from tests.unit.test_api import base_job, with_spec

ENV_NAMES = sorted(contract.RESERVED_ENV_NAMES) + [
    "PET_ANYTHING", "DTRAIN_X", "NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "MY_VAR", "PETS", "DTRAINER",
    "NCCLX", "TORCH_NCCLX", "path", "_under", "a.b-c",
]


@pytest.mark.parametrize("name", ENV_NAMES)
def test_env_name_rules_agree_with_the_model(admission: KubeAdmission, name):
    model_ok = True
    try:
        api.EnvVar.model_validate({"name": name, "value": "1"})
    except pydantic.ValidationError:
        model_ok = False
    assert (admission.causes(with_spec("env", [{"name": name, "value": "1"}])) == []) == model_ok, name


@pytest.mark.parametrize("key", ["NCCL_ALGO", "TORCH_NCCL_TRACE", "NCCL_", "nccl_algo", "IB_HCA", "NCCL_A-B", "NCCL_9"])
def test_nccl_env_key_rule_agrees_with_the_model(admission: KubeAdmission, key):
    model_ok = True
    try:
        api.NcclSettings.model_validate({"env": {key: "1"}})
    except pydantic.ValidationError:
        model_ok = False
    assert (admission.causes(with_spec("nccl.env", {key: "1"})) == []) == model_ok, key


@pytest.mark.parametrize("low,opt,high", list(itertools.product([1, 8, 32], [None, 1, 16, 64], [8, 32])))
def test_engine_batch_rule_agrees_with_the_model(admission: KubeAdmission, low, opt, high):
    engine = {"minBatch": low, "maxBatch": high, **({"optBatch": opt} if opt is not None else {})}
    model_ok = True
    try:
        api.EngineSettings.model_validate(engine)
    except pydantic.ValidationError:
        model_ok = False
    assert (admission.causes(with_spec("engine", engine)) == []) == model_ok, engine


@pytest.mark.parametrize("nodes,min_available", list(itertools.product([1, 2, 4], [None, 1, 3, 4, 5])))
def test_gang_rule_agrees_with_the_model(admission: KubeAdmission, nodes, min_available):
    gang = {"enabled": True, **({"minAvailable": min_available} if min_available else {})}
    obj = with_spec("scheduling", {"schedulerName": "volcano", "gang": gang})
    obj["spec"]["nodes"] = nodes
    model_ok = True
    try:
        api.DistributedTraining.model_validate(obj)
    except pydantic.ValidationError:
        model_ok = False
    assert (admission.causes(obj) == []) == model_ok


@pytest.mark.parametrize(
    "enabled,provider,scheduler",
    list(itertools.product([True, False], [None, "kubernetes", "volcano", "scheduler-plugins"], [None, "volcano", "my-scheduler"])),
)
def test_gang_scheduler_rule_agrees_with_the_model(admission: KubeAdmission, enabled, provider, scheduler):
    """Which gangs need a schedulerName: all but Kubernetes' own."""
    scheduling = {"gang": {"enabled": enabled, **({"provider": provider} if provider else {})},
                  **({"schedulerName": scheduler} if scheduler else {})}
    obj = with_spec("scheduling", scheduling)
    model_ok = True
    try:
        api.DistributedTraining.model_validate(obj)
    except pydantic.ValidationError:
        model_ok = False
    assert model_ok == (not enabled or scheduler is not None or provider == "kubernetes")
    assert (admission.causes(obj) == []) == model_ok


@pytest.mark.parametrize("name", ["job", "a", "x" * 45, "x" * 46, "MyJob", "9lives", "my-job", "my_job", "job-"])
def test_name_rule_agrees_with_the_model(admission: KubeAdmission, name):
    obj = {**base_job(), "metadata": {"name": name}}
    model_ok = True
    try:
        api.DistributedTraining.model_validate(obj)
    except pydantic.ValidationError:
        model_ok = False
    assert (admission.causes(obj) == []) == model_ok, name


@pytest.mark.parametrize(
    "pattern",
    ["CUDA error", "(?i)nccl.*timeout", "(unclosed", "a(?=b)", "a(?<!b)", r"(a)\1", r"\pL+", "[[:alpha:]]+",
     r"end\z", r"end\Z", "a{1000}", "a{1001}", "[z-a]", "*", r"\Q(literal)\E"],
)
def test_termination_message_rule_agrees_with_the_model(admission: KubeAdmission, pattern):
    """RE2 both: google-re2 in the model, Go's RE2 in the API server's CEL."""
    model_ok = True
    try:
        api.FailureRule.model_validate({"action": "FailJob", "onTerminationMessage": pattern})
    except pydantic.ValidationError:
        model_ok = False
    obj = with_spec("runPolicy.failureRules", [{"action": "FailJob", "onTerminationMessage": pattern}])
    assert (admission.causes(obj) == []) == model_ok, pattern
