"""The chart's tenancy policy, judged by the session's real kube-apiserver (tests/kube_admission.py): at
`kubectl apply` by a user holding the chart's edit role, no job in the operator's namespace, none as the
operator's account or another account the chart does not allow, no API token outside an allowed account,
and no reference to the operator's Secrets (core/tenancy.py decides the same in the operator)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.chart.helm import helm_template
from tests.kube_admission import KubeAdmission, Refused

USER = "alice@example.com"
OPERATOR = "system:serviceaccount:dtrain-system:dtrain-operator"
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
TAKES_EFFECT_SECONDS = 30.0  # the server's policy cache follows a new or deleted policy within about a second


def tenancy_objects(kind: str, **tenancy: Any) -> dict[str, Any]:
    objects = helm_template({"tenancy": tenancy} if tenancy else None)
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["labels"].get("app.kubernetes.io/component") == "tenancy")


def job(namespace: str = "team-a", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "dtrain.dev/v1alpha1", "kind": "DistributedTraining",
            "metadata": {"name": "resnet", "namespace": namespace},
            "spec": {"nodes": 2, "storage": {"claimName": "shared"}, **spec}}


class TenancyPolicy:
    """The chart's policy and binding in the server, with the allowed accounts a test asks for; the chart's
    edit role bound to the user (and, to show the policy lets it be, to the operator's account)."""

    def __init__(self, admission: KubeAdmission) -> None:
        self.admission = admission
        self.allowed: tuple[str, ...] | None = None
        [edit] = [o for o in helm_template() if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-edit")]
        admission.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", edit)
        admission.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "tenancy-test-users"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": edit["metadata"]["name"]},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER},
                         {"kind": "ServiceAccount", "name": "dtrain-operator", "namespace": "dtrain-system"}],
        })
        for namespace in ("team-a", "team-b", "dtrain-system"):
            admission.namespace(namespace)

    def admit(self, obj: dict[str, Any], user: str = USER, allowed: tuple[str, ...] = ()) -> tuple[bool, list[str]]:
        """(allowed, messages) as the server decides `user`'s create under the policy with these accounts."""
        self.use(allowed)
        return self._judge(obj, user)

    def _judge(self, obj: dict[str, Any], user: str = USER) -> tuple[bool, list[str]]:
        try:
            self.admission.check(obj, user=user)
        except Refused as refused:
            assert refused.status == 403 and "ValidatingAdmissionPolicy" in str(refused), refused
            return False, [str(refused).split("denied request: ", 1)[1]]
        return True, []

    def use(self, allowed: tuple[str, ...]) -> None:
        if self.allowed == allowed:
            return
        self.remove()
        values = {"allowedServiceAccounts": list(allowed)} if allowed else {}
        self.admission.request("POST", POLICIES, tenancy_objects("ValidatingAdmissionPolicy", **values))
        self.admission.request("POST", BINDINGS, tenancy_objects("ValidatingAdmissionPolicyBinding", **values))
        self.allowed = allowed
        # In force when the operator's namespace is refused, and an account is allowed exactly where it is.
        self._until(lambda: not self._judge(job("dtrain-system"))[0]
                    and self._judge(job(serviceAccountName="iam"))[0] == ("team-a/iam" in allowed))

    def remove(self) -> None:
        if self.allowed is None:
            return
        name = tenancy_objects("ValidatingAdmissionPolicy")["metadata"]["name"]
        self.admission.request("DELETE", f"{BINDINGS}/{name}")
        self.admission.request("DELETE", f"{POLICIES}/{name}")
        self.allowed = None
        self._until(lambda: self._judge(job("dtrain-system"))[0])  # no longer in force: other tests share the server

    @staticmethod
    def _until(check: Any) -> None:
        deadline = time.monotonic() + TAKES_EFFECT_SECONDS
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError(f"the tenancy policy did not take effect within {TAKES_EFFECT_SECONDS:.0f} s")
            time.sleep(0.1)


@pytest.fixture(scope="module")
def policy(admission: KubeAdmission) -> Iterator[TenancyPolicy]:
    policy = TenancyPolicy(admission)
    yield policy
    policy.remove()
    admission.request("DELETE", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/tenancy-test-users")


def api_token(audience: str | None = None) -> list[dict[str, Any]]:
    token: dict[str, Any] = {"path": "token", **({"audience": audience} if audience is not None else {})}
    return [{"name": "token", "projected": {"sources": [{"serviceAccountToken": token}]}}]


def test_the_binding_denies_with_the_policy():
    binding = tenancy_objects("ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == tenancy_objects("ValidatingAdmissionPolicy")["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_an_ordinary_job_in_a_user_namespace_is_admitted(policy: TenancyPolicy):
    assert policy.admit(job()) == (True, [])
    assert policy.admit(job(serviceAccountName="dtrain-trainer", volumes=api_token("vault"))) == (True, [])


def test_no_job_in_the_operators_namespace(policy: TenancyPolicy):
    allowed, messages = policy.admit(job("dtrain-system"))
    assert not allowed and messages[0].startswith("metadata.namespace: dtrain-system is the dtrain operator's own namespace")


def test_no_job_runs_as_the_operator(policy: TenancyPolicy):
    """The server names the first rule a job breaks: in the operator's namespace, that one (above)."""
    allowed, messages = policy.admit(job(serviceAccountName="dtrain-operator"))
    assert not allowed and messages[0].startswith("spec.serviceAccountName: dtrain-operator is the dtrain operator's own account")


def test_another_account_only_where_the_chart_allows_it(policy: TenancyPolicy):
    allowed, messages = policy.admit(job(serviceAccountName="iam"))
    assert not allowed and "this account is not allowed in this namespace" in messages[0]
    assert policy.admit(job(serviceAccountName="iam"), allowed=("team-a/iam",)) == (True, [])
    assert not policy.admit(job("team-b", serviceAccountName="iam"), allowed=("team-a/iam",))[0]


@pytest.mark.parametrize("audience", [None, "", "https://kubernetes.default.svc.cluster.local"])
def test_an_api_token_only_under_an_allowed_account(policy: TenancyPolicy, audience):
    allowed, messages = policy.admit(job(volumes=api_token(audience)))
    assert not allowed and "a token for the Kubernetes API" in messages[0]
    assert policy.admit(job(serviceAccountName="iam", volumes=api_token(audience)), allowed=("team-a/iam",)) == (True, [])


@pytest.mark.parametrize("spec", [
    {"volumes": [{"name": "key", "secret": {"secretName": "dtrain-operator-report-tls"}}]},
    {"volumes": [{"name": "tls", "projected": {"sources": [{"secret": {"name": "dtrain-operator-report-tls"}}]}}]},
    {"env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "dtrain-operator-report-tls", "key": "key"}}}]},
    {"storage": {"url": "s3://bucket/p", "credentialsSecret": "dtrain-operator-report-tls"}},
    {"imagePullSecrets": [{"name": "dtrain-operator-report-tls"}]},
], ids=["volume", "projected", "env", "storage", "pull secret"])
def test_no_reference_to_the_operators_secrets(policy: TenancyPolicy, spec):
    allowed, messages = policy.admit(job(**spec))
    assert not allowed and "names a Secret of the dtrain operator's" in messages[0]
    assert policy.admit(job(env=[{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "mine", "key": "k"}}}])) == (True, [])


def test_the_operator_itself_is_not_matched(policy: TenancyPolicy):
    assert policy.admit(job("dtrain-system", serviceAccountName="dtrain-operator"), user=OPERATOR) == (True, [])
