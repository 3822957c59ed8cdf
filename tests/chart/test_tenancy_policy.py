"""The chart's tenancy policy, evaluated by a real CEL engine (admission.py): at `kubectl apply`, no job in
the operator's namespace, none as the operator's account or another account the chart does not allow, no
API token outside an allowed account, and no reference to the operator's Secrets (core/tenancy.py decides
the same in the operator)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart import admission
from tests.chart.helm import helm_template

USER = "alice@example.com"
OPERATOR = "system:serviceaccount:dtrain-system:dtrain-operator"


def policy(**tenancy: Any) -> dict[str, Any]:
    objects = helm_template({"tenancy": tenancy} if tenancy else None)
    return next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
                and o["metadata"]["labels"].get("app.kubernetes.io/component") == "tenancy")


def job(namespace: str = "team-a", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "dtrain.dev/v1alpha1", "kind": "DistributedTraining",
            "metadata": {"name": "resnet", "namespace": namespace}, "spec": {"nodes": 2, **spec}}


def admit(obj: dict[str, Any], user: str = USER, the_policy: dict[str, Any] | None = None) -> tuple[bool, list[str]]:
    request = {"namespace": obj["metadata"]["namespace"], "operation": "CREATE", "userInfo": {"username": user, "groups": []}}
    return admission.admit(the_policy or policy(), request, None, obj)


def api_token(audience: str | None = None) -> list[dict[str, Any]]:
    token: dict[str, Any] = {"path": "token", **({"audience": audience} if audience is not None else {})}
    return [{"name": "token", "projected": {"sources": [{"serviceAccountToken": token}]}}]


def test_every_expression_compiles_and_the_policy_denies():
    admission.compile_all(policy())
    admission.compile_all(policy(allowedServiceAccounts=["team-a/iam"]))
    binding = next(o for o in helm_template() if o["kind"] == "ValidatingAdmissionPolicyBinding"
                   and o["metadata"]["labels"].get("app.kubernetes.io/component") == "tenancy")
    assert binding["spec"]["policyName"] == policy()["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_an_ordinary_job_in_a_user_namespace_is_admitted():
    assert admit(job()) == (True, [])
    assert admit(job(serviceAccountName="dtrain-trainer", volumes=api_token("vault"))) == (True, [])


def test_no_job_in_the_operators_namespace():
    allowed, messages = admit(job("dtrain-system"))
    assert not allowed and messages[0].startswith("metadata.namespace: dtrain-system is the dtrain operator's own namespace")


@pytest.mark.parametrize("namespace", ["team-a", "dtrain-system"])
def test_no_job_runs_as_the_operator(namespace):
    allowed, messages = admit(job(namespace, serviceAccountName="dtrain-operator"))
    assert not allowed and any("dtrain-operator is the dtrain operator's own account" in m for m in messages)


def test_another_account_only_where_the_chart_allows_it():
    allowed, messages = admit(job(serviceAccountName="iam"))
    assert not allowed and "this account is not allowed in this namespace" in messages[0]
    permissive = policy(allowedServiceAccounts=["team-a/iam"])
    assert admit(job(serviceAccountName="iam"), the_policy=permissive) == (True, [])
    assert not admit(job("team-b", serviceAccountName="iam"), the_policy=permissive)[0]


@pytest.mark.parametrize("audience", [None, "", "https://kubernetes.default.svc.cluster.local"])
def test_an_api_token_only_under_an_allowed_account(audience):
    allowed, messages = admit(job(volumes=api_token(audience)))
    assert not allowed and "a token for the Kubernetes API" in messages[0]
    permissive = policy(allowedServiceAccounts=["team-a/iam"])
    assert admit(job(serviceAccountName="iam", volumes=api_token(audience)), the_policy=permissive) == (True, [])


@pytest.mark.parametrize("spec", [
    {"volumes": [{"name": "key", "secret": {"secretName": "dtrain-operator-report-tls"}}]},
    {"volumes": [{"name": "tls", "projected": {"sources": [{"secret": {"name": "dtrain-operator-report-tls"}}]}}]},
    {"env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "dtrain-operator-report-tls", "key": "key"}}}]},
    {"storage": {"url": "s3://b/p", "credentialsSecret": "dtrain-operator-report-tls"}},
    {"imagePullSecrets": [{"name": "dtrain-operator-report-tls"}]},
], ids=["volume", "projected", "env", "storage", "pull secret"])
def test_no_reference_to_the_operators_secrets(spec):
    allowed, messages = admit(job(**spec))
    assert not allowed and "names a Secret of the dtrain operator's" in messages[0]
    assert admit(job(env=[{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "mine", "key": "k"}}}])) == (True, [])


def test_the_operator_itself_is_not_matched():
    assert admit(job("dtrain-system", serviceAccountName="dtrain-operator"), user=OPERATOR) == (True, [])
