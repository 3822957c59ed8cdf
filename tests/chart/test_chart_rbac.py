"""The Helm chart's RBAC: the Roles and ClusterRoles it grants the operator in each install mode, the
nothing it grants the trainers, the roles users hold, and what is left out without RBAC (the rest of
what each value renders: test_chart_render.py).

Rendering runs the real helm binary; every assertion is about the objects Kubernetes would get.
"""

from __future__ import annotations

from dtrain_operator.cli import main as cli
from dtrain_operator.controller.main import operator_settings
from tests.chart.helm import (
    NAMESPACE,
    RBAC_LABEL,
    deployment,
    granted,
    helm_notes,
    helm_template,
    of_kind,
    operator_container,
    rbac_rules,
)
from tests.chart.value_sets import VALUE_SETS


def test_namespaced_install_uses_roles_in_each_watched_namespace() -> None:
    objects = helm_template(VALUE_SETS["namespaced"][0])
    # The Roles in the operator's own namespace (the Lease, the report endpoint's certificate) are apart.
    own = ("-leader-election", "-report-tls")
    apart = [r for r in of_kind(objects, "Role") if r["metadata"]["name"].endswith(own)]
    assert [r["metadata"]["namespace"] for r in apart] == [NAMESPACE, NAMESPACE]
    roles = [r for r in of_kind(objects, "Role") if r not in apart]
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    operator_bindings = [
        b for b in of_kind(objects, "RoleBinding")
        if b["roleRef"]["kind"] == "Role" and not b["roleRef"]["name"].endswith(own)
    ]
    assert sorted(b["metadata"]["namespace"] for b in operator_bindings) == ["team-a", "team-b"]
    for binding in operator_bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dtrain-operator", "namespace": NAMESPACE}]
    # Nothing cluster-wide for the operator but the TokenReview of the report endpoint, and the same
    # rules as a cluster-wide install.
    (review,) = [r for r in of_kind(objects, "ClusterRole") if r["metadata"]["labels"].get(RBAC_LABEL) == "operator"]
    assert review["metadata"]["name"] == "dtrain-operator-token-review"
    assert granted(review["rules"]) == {("authentication.k8s.io", "tokenreviews", "create")}
    assert [b["metadata"]["name"] for b in of_kind(objects, "ClusterRoleBinding")] == ["dtrain-operator-token-review"]
    cluster_wide = rbac_rules(
        [r for r in of_kind(helm_template(), "ClusterRole")
         if r["metadata"]["labels"].get(RBAC_LABEL) == "operator" and not r["metadata"]["name"].endswith("-token-review")]
    )
    for role in roles:
        assert role["rules"] == cluster_wide
    own_rules = [r for role in apart for r in role["rules"]]
    token_review = [r for r in rbac_rules(objects) if r["resources"] == ["tokenreviews"]]
    assert token_review + own_rules == [r for r in rbac_rules(helm_template(), "operator") if r not in cluster_wide]


def test_operator_needs_nothing_cluster_scoped() -> None:
    """The chart grants no CRD watch and no namespace list: that holds because the operator runs
    kopf standalone (no peering objects) and with its CRD and namespace scans disabled."""
    args = operator_container(helm_template(VALUE_SETS["namespaced"][0]))["args"]
    settings = operator_settings(cli.build_parser().parse_args(["operator", *args]))
    assert settings.scanning.disabled is True
    assert settings.peering.standalone is True
    resources = {resource for _, resource, _ in granted(rbac_rules(helm_template(), "operator"))}
    assert not resources & {"customresourcedefinitions", "namespaces", "kopfpeerings", "clusterkopfpeerings"}


def test_owner_reference_permission_enforcement_adds_only_finalizers_update() -> None:
    plain = granted(rbac_rules(helm_template(), "operator"))
    enforced = granted(rbac_rules(helm_template({"rbac": {"ownerReferencesPermissionEnforcement": True}}), "operator"))
    assert enforced - plain == {("dtrain.dev", "distributedtrainings/finalizers", "update")}
    assert plain <= enforced


def test_trainers_hold_no_api_permission() -> None:
    """The trainers' ServiceAccount is bound to nothing and mounts no token: rank 0 reports to the operator."""
    objects = helm_template(VALUE_SETS["namespaced"][0])
    assert not rbac_rules(objects, "trainer")
    accounts = [sa for sa in of_kind(objects, "ServiceAccount") if sa["metadata"]["name"] == "dtrain-trainer"]
    assert sorted(sa["metadata"]["namespace"] for sa in accounts) == ["team-a", "team-b"]
    assert all(sa["automountServiceAccountToken"] is False for sa in accounts)
    for binding in [*of_kind(objects, "RoleBinding"), *of_kind(objects, "ClusterRoleBinding")]:
        assert all(subject["name"] != "dtrain-trainer" for subject in binding["subjects"])
    assert not of_kind(objects, "ValidatingAdmissionPolicy") or all(
        "trainer" not in policy["metadata"]["name"] for policy in of_kind(objects, "ValidatingAdmissionPolicy")
    )


def test_trainer_namespaces_when_watching_everything() -> None:
    objects = helm_template({"trainerServiceAccount": {"namespaces": ["research", NAMESPACE]}})
    accounts = [sa for sa in of_kind(objects, "ServiceAccount") if sa["metadata"]["name"] == "dtrain-trainer"]
    assert [sa["metadata"]["namespace"] for sa in accounts] == ["research"]  # never the operator's own


def test_users_edit_jobs_and_only_read_their_status() -> None:
    """The default admin/edit/view roles carry DistributedTrainings; no role users hold writes their status."""
    roles = {r["metadata"]["name"]: r for r in of_kind(helm_template(), "ClusterRole")
             if r["metadata"]["labels"].get("app.kubernetes.io/component") == "users"}
    assert set(roles) == {"dtrain-operator-edit", "dtrain-operator-view"}
    edit, view = granted(roles["dtrain-operator-edit"]["rules"]), granted(roles["dtrain-operator-view"]["rules"])
    assert ("dtrain.dev", "distributedtrainings", "create") in edit
    assert {verb for _, resource, verb in edit | view if resource == "distributedtrainings/status"} == {"get", "list", "watch"}
    labels = roles["dtrain-operator-edit"]["metadata"]["labels"]
    assert labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert roles["dtrain-operator-view"]["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert not [r for r in of_kind(helm_template({"rbac": {"aggregateToDefaultRoles": False}}), "ClusterRole")
                if r["metadata"]["labels"].get("app.kubernetes.io/component") == "users"]


def test_no_rbac_renders_no_roles_and_uses_the_given_service_account() -> None:
    objects = helm_template(VALUE_SETS["no-rbac"][0])
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"):
        assert not of_kind(objects, kind), kind
    assert deployment(objects)["spec"]["template"]["spec"]["serviceAccountName"] == "platform-operator"
    assert "rbac.create is false" in helm_notes(VALUE_SETS["no-rbac"][0])


def test_refusing_host_access_grants_get_on_the_watched_namespaces_only() -> None:
    values = {"hostAccess": {"refuse": True}, "watchNamespaces": ["ml", "rdma"]}
    objects = helm_template(values)
    role = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("-namespaces"))
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"], "resourceNames": ["ml", "rdma"]}
    ]
    assert "--refuse-host-access" in operator_container(objects)["args"]
    assert not any(o["metadata"]["name"].endswith("-namespaces") for o in helm_template())
