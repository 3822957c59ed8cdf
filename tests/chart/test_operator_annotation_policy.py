"""The chart's ValidatingAdmissionPolicy that keeps the operator's annotations the operator's,
evaluated by a real CEL engine (admission.py).

A user who may edit a DistributedTraining may write its annotations; the operator's signed
record (dtrain.dev/state) must never come from them. The operator checks the signature anyway;
this policy refuses the attempt at the API, with a message that says why.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dtrain_operator.api import contract
from tests.chart import admission

NAMESPACE = "team-a"
USER = "alice@example.com"
OPERATOR = "system:serviceaccount:dtrain-system:dtrain-operator"
RECORD = '{"version":2,"acceptedSpec":{"hostNetwork":true}}'


def policy() -> dict[str, Any]:
    return admission.chart_policy("operator")


def job(**annotations: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "resnet", "namespace": NAMESPACE}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "dtrain.dev/v1alpha1", "kind": "DistributedTraining", "metadata": meta, "spec": {"nodes": 2}}


def request(operation: str, user: str = USER) -> dict[str, Any]:
    return {"namespace": NAMESPACE, "operation": operation, "userInfo": {"username": user, "groups": []}}


def annotated(obj: dict[str, Any], **annotations: str) -> dict[str, Any]:
    new = copy.deepcopy(obj)
    new["metadata"].setdefault("annotations", {}).update(annotations)
    return new


STATE = {contract.ANNOTATION_STATE: RECORD}
ESTIMATE = {contract.ANNOTATION_MEMORY_ESTIMATE: '{"fits":true}'}


def test_every_expression_compiles_and_the_policy_denies():
    admission.compile_all(policy())
    binding = admission.chart_policy("operator", "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy()["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy()["spec"]["failurePolicy"] == "Fail"


def test_the_policy_names_exactly_the_annotations_users_own():
    for validation in policy()["spec"]["validations"]:
        assert f"k in {list(contract.USER_ANNOTATIONS)!r}".replace("'", '"') in validation["expression"]


def test_a_user_cannot_create_a_job_with_the_operators_record():
    allowed, messages = admission.admit(policy(), request("CREATE"), None, job(**STATE))
    assert not allowed and "written only by the dtrain operator" in messages[0]
    assert admission.admit(policy(), request("CREATE"), None, job(**{"dtrain.dev/last-handled-configuration": "{}"}))[0] is False


@pytest.mark.parametrize("new", [job(), job(team="vision"), job(**ESTIMATE)], ids=["plain", "other annotations", "memory estimate"])
def test_a_user_creates_an_ordinary_job(new):
    assert admission.admit(policy(), request("CREATE"), None, new) == (True, [])


def test_a_user_cannot_set_change_or_remove_the_record():
    plain, recorded = job(), job(**STATE)
    assert not admission.admit(policy(), request("UPDATE"), plain, recorded)[0]
    assert not admission.admit(policy(), request("UPDATE"), recorded, annotated(recorded, **{contract.ANNOTATION_STATE: "{}"}))[0]
    allowed, messages = admission.admit(policy(), request("UPDATE"), recorded, plain)
    assert not allowed and "may not be removed" in messages[0]


def test_a_user_may_edit_other_annotations_and_the_estimate_beside_the_record():
    recorded = job(**STATE)
    new = annotated(recorded, team="vision", **ESTIMATE)
    assert admission.admit(policy(), request("UPDATE"), recorded, new) == (True, [])


def test_the_operator_writes_its_record():
    assert admission.admit(policy(), request("UPDATE", OPERATOR), job(), job(**STATE)) == (True, [])
