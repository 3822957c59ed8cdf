"""The test API server's RBAC (authz.py) with the chart's rendered roles: what each service account
may do is decided by running requests, 401 without a token and 403 for what the chart does not grant."""

from __future__ import annotations

from pathlib import Path

import kmock
import pytest

from dtrain_operator.api import contract
from tests.builders import a_cpu_job

from .apiserver import ApiServer
from .authz import Attributes, Authorizer, User, rule_allows

NS = "dtrain-system"
DTR = f"/apis/{contract.API_VERSION}/namespaces/{NS}/{contract.PLURAL}"


@pytest.fixture
def chart_rbac():
    from tests.chart.helm import helm_template

    return [o for o in helm_template(namespace=NS) if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]


async def _call(api: ApiServer, method: str, path: str, token: str | None, body=None, content_type="application/json"):
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with api.request(method, path, json=body, headers=headers) as response:
        return response.status


async def test_each_service_account_gets_what_the_chart_grants_and_nothing_else(chart_rbac, tmp_path: Path):
    authz = Authorizer(chart_rbac)
    admin = authz.admin_token()
    operator = authz.issue(User.service_account(NS, "dtrain-operator"))
    trainer = authz.issue(User.service_account(NS, "dtrain-trainer"))
    other_trainer = authz.issue(User.service_account("elsewhere", "dtrain-trainer"))
    async with ApiServer(authorizer=authz) as api, kmock.Server(api):
        api.declare_resources()
        assert await _call(api, "POST", DTR, admin, a_cpu_job("rbac").in_namespace(NS).as_dict()) == 201
        assert await _call(api, "GET", DTR, None) == 401
        assert await _call(api, "GET", DTR, "made-up") == 401
        assert await _call(api, "GET", "/apis", trainer) == 200  # discovery: every authenticated user
        # The operator: list/watch jobs everywhere, pods create/delete, status patches, never secrets of others.
        assert await _call(api, "GET", f"/apis/{contract.API_VERSION}/{contract.PLURAL}", operator) == 200
        assert await _call(api, "GET", f"/api/v1/namespaces/{NS}/pods", operator) == 200
        # It patches the object itself only for its own record (the dtrain.dev/state annotation).
        assert await _call(api, "PATCH", f"{DTR}/rbac", operator, {"metadata": {"annotations": {"a": "b"}}},
                           "application/merge-patch+json") == 200
        assert await _call(api, "GET", f"/api/v1/namespaces/{NS}/secrets", operator) == 403
        assert await _call(api, "PATCH", f"{DTR}/rbac/status", operator, {"status": {"phase": "Pending"}},
                           "application/merge-patch+json") == 200
        # The trainer: only a patch of its job's status, in the namespace the chart bound it in.
        status = {"status": {"progress": {"step": 3}}}
        assert await _call(api, "PATCH", f"{DTR}/rbac/status", trainer, status, "application/merge-patch+json") == 200
        assert await _call(api, "GET", f"{DTR}/rbac", trainer) == 403
        assert await _call(api, "GET", f"/api/v1/namespaces/{NS}/pods", trainer) == 403
        assert await _call(api, "PATCH", f"{DTR}/rbac/status", other_trainer, status,
                           "application/merge-patch+json") == 403
    assert (User.service_account(NS, "dtrain-trainer").name, Attributes(
        "get", contract.GROUP, contract.PLURAL, NS, "rbac")) in authz.denied


def test_rules_read_wildcards_subresources_and_resource_names():
    pods_status = Attributes("patch", "", "pods/status", "ns", "p")
    assert rule_allows({"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}, pods_status)
    assert not rule_allows({"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}, pods_status)
    assert rule_allows({"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["*"]}, pods_status)
    assert rule_allows({"apiGroups": [""], "resources": ["*"], "verbs": ["patch"]}, pods_status)
    named = {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"], "resourceNames": ["q"]}
    assert not rule_allows(named, pods_status)
