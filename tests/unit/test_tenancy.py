"""Who a job's pods may be (core/tenancy.py): the refusals name the field and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from dtrain_operator.api import DistributedTrainingSpec
from dtrain_operator.core.tenancy import Tenancy, api_token_fields, tenancy_refusals

TENANCY = Tenancy(
    operator_namespace="dtrain-system",
    operator_service_account="dtrain-operator",
    trainer_service_account="dtrain-trainer",
    allowed_service_accounts=frozenset({"team-a/iam"}),
    operator_secrets=frozenset({"dtrain-operator-report-tls"}),
    api_audiences=frozenset({"https://issuer.example.com"}),
)


def spec(**fields: Any) -> DistributedTrainingSpec:
    return DistributedTrainingSpec.model_validate({"nodes": 1, **fields})


def token_volume(audience: str | None) -> dict[str, Any]:
    token: dict[str, Any] = {"path": "token", **({"audience": audience} if audience is not None else {})}
    return {"name": "token", "projected": {"sources": [{"configMap": {"name": "ca"}}, {"serviceAccountToken": token}]}}


def test_a_plain_job_in_a_user_namespace_may_run():
    assert tenancy_refusals(spec(), "team-a", TENANCY) == []
    assert tenancy_refusals(spec(volumes=[token_volume("vault")]), "team-b", TENANCY) == []


def test_no_job_runs_in_the_operators_namespace():
    refused = tenancy_refusals(spec(), "dtrain-system", TENANCY)
    assert len(refused) == 1 and refused[0].startswith("metadata.namespace: dtrain-system is the dtrain operator's own")
    assert "kubectl -n team-a apply" in refused[0]


@pytest.mark.parametrize("namespace", ["team-a", "team-b"])
def test_no_job_runs_as_the_operator_in_any_namespace(namespace):
    refused = tenancy_refusals(spec(serviceAccountName="dtrain-operator"), namespace, TENANCY)
    assert refused == [("spec.serviceAccountName: dtrain-operator is the dtrain operator's own account, which no job "
                       "runs as; remove spec.serviceAccountName (jobs run as dtrain-trainer)")]


def test_another_account_only_where_an_administrator_allowed_it():
    assert tenancy_refusals(spec(serviceAccountName="iam"), "team-a", TENANCY) == []
    refused = tenancy_refusals(spec(serviceAccountName="iam"), "team-b", TENANCY)
    assert refused[0].startswith("spec.serviceAccountName: iam is not allowed in namespace team-b")
    assert "add team-b/iam to the chart's tenancy.allowedServiceAccounts" in refused[0]


@pytest.mark.parametrize("audience", [None, "", "https://kubernetes.default.svc.cluster.local", "https://issuer.example.com"])
def test_an_api_token_only_under_an_allowed_account(audience):
    volumes = [token_volume(audience)]
    assert api_token_fields(spec(volumes=volumes), TENANCY.api_audiences) == ["spec.volumes[0].projected.sources[1].serviceAccountToken"]
    refused = tenancy_refusals(spec(volumes=volumes), "team-a", TENANCY)
    assert refused == [(f"{api_token_fields(spec(volumes=volumes), TENANCY.api_audiences)[0]} (a token for the Kubernetes "
                       "API) is allowed only under a service account a cluster administrator allowed (the chart's "
                       "tenancy.allowedServiceAccounts); set its audience to the service that reads it, or remove it")]
    assert tenancy_refusals(spec(serviceAccountName="iam", volumes=volumes), "team-a", TENANCY) == []


@pytest.mark.parametrize(("fields", "where"), [
    ({"volumes": [{"name": "key", "secret": {"secretName": "dtrain-operator-report-tls"}}]}, "spec.volumes[0].secret.secretName"),
    ({"volumes": [{"name": "tls", "projected": {"sources": [{"secret": {"name": "dtrain-operator-report-tls"}}]}}]},
     "spec.volumes[0].projected.sources[0].secret.name"),
    ({"env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "dtrain-operator-report-tls", "key": "key"}}}]},
     "spec.env[0].valueFrom.secretKeyRef.name"),
    ({"storage": {"url": "s3://bucket/jobs", "credentialsSecret": "dtrain-operator-report-tls"}}, "spec.storage.credentialsSecret"),
    ({"imagePullSecrets": [{"name": "dtrain-operator-report-tls"}]}, "spec.imagePullSecrets[0].name"),
])
def test_no_job_names_the_operators_secrets(fields, where):
    refused = tenancy_refusals(spec(**fields), "team-a", TENANCY)
    assert len(refused) == 1 and refused[0].startswith(f"{where}: dtrain-operator-") and "remove it" in refused[0]
