"""The Helm chart: `helm lint`, `helm template` with each value set, and what each value does
(what it grants, its RBAC: test_chart_rbac.py).

Rendering runs the real helm binary; every assertion is about the objects Kubernetes would get.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from dtrain_operator.api import contract
from dtrain_operator.api.crd import crd
from dtrain_operator.api.validation import parse_job_defaults, validate_file
from dtrain_operator.cli import main as cli
from tests.chart.helm import (
    CHART_DIR,
    MONITORING_API,
    NAMESPACE,
    HelmError,
    deployment,
    helm_lint,
    helm_notes,
    helm_template,
    of_kind,
    one,
    operator_container,
)
from tests.chart.value_sets import VALUE_SETS
from tests.cluster import kube  # noqa: F401 - puts tools/cluster's localcluster on the path

from localcluster.up import job_defaults  # isort: skip

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_passes(name: str) -> None:
    values, _ = VALUE_SETS[name]
    assert "0 chart(s) failed" in helm_lint(values)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_operator_args_are_flags_the_operator_accepts(name: str) -> None:
    """Every argument the chart passes parses with the real `dtrain operator` parser."""
    values, api_versions = VALUE_SETS[name]
    args = operator_container(helm_template(values, api_versions=api_versions))["args"]
    parsed = cli.build_parser().parse_args(["operator", *args])
    operator_values = values.get("operator", {})
    assert parsed.log_level == operator_values.get("logLevel", "INFO")
    assert parsed.log_format == operator_values.get("logFormat", "plain")
    assert parsed.qps == operator_values.get("qps", 500)
    assert parsed.burst == operator_values.get("burst", 1000)
    assert parsed.watch_timeout == operator_values.get("watchTimeout", 300)
    assert parsed.network_policy is bool(values.get("networkPolicy", {}).get("enabled"))
    assert parsed.namespaces == (values.get("watchNamespaces") or None)
    assert parsed.all_namespaces is not bool(values.get("watchNamespaces"))


def test_defaults_install_a_cluster_wide_operator() -> None:
    objects = helm_template()
    assert {obj["kind"] for obj in objects} == {
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Service",
        "Deployment",
        "ConfigMap",
        "NetworkPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    dep = deployment(objects)
    assert dep["metadata"]["name"] == "dtrain-operator"
    assert dep["metadata"]["namespace"] == NAMESPACE
    assert dep["spec"]["replicas"] == 1
    # Leader election: a new pod stands by before the old one stops and hands the Lease over.
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "dtrain-operator"
    accounts = {(sa["metadata"]["namespace"], sa["metadata"]["name"]) for sa in of_kind(objects, "ServiceAccount")}
    # No trainer account in the operator's namespace: no job runs there.
    assert accounts == {(NAMESPACE, "dtrain-operator")}
    # The only Roles: the Lease and the report endpoint's certificate, in the operator's own namespace.
    roles = {role["metadata"]["name"]: role for role in of_kind(objects, "Role")}
    assert set(roles) == {"dtrain-operator-leader-election", "dtrain-operator-report-tls"}
    assert {role["metadata"]["namespace"] for role in roles.values()} == {NAMESPACE}
    assert {r["apiGroups"][0] for r in roles["dtrain-operator-leader-election"]["rules"]} == {"coordination.k8s.io"}
    key_rules = roles["dtrain-operator-report-tls"]["rules"]
    assert {(tuple(r["verbs"]), tuple(r.get("resourceNames", ()))) for r in key_rules} == {
        (("create",), ()), (("get",), ("dtrain-operator-report-tls",))
    }
    bindings = {b["roleRef"]["name"]: b for b in of_kind(objects, "ClusterRoleBinding")}
    assert set(bindings) == {"dtrain-operator", "dtrain-operator-token-review"}
    for binding in bindings.values():
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "dtrain-operator", "namespace": NAMESPACE}]


def test_probes_and_ports_use_the_operator_ports() -> None:
    container = operator_container(helm_template({"operator": {"healthPort": 9440}, "metrics": {"port": 9441}}))
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"health": 9440, "metrics": 9441, "reports": 8443}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    parsed = cli.build_parser().parse_args(["operator", *container["args"]])
    assert (parsed.health_port, parsed.metrics_port) == (9440, 9441)


def test_crd_is_the_generated_one_and_kept_on_uninstall() -> None:
    rendered = one(helm_template(), "CustomResourceDefinition")
    generated = crd()
    assert rendered["spec"] == generated["spec"]
    assert rendered["metadata"]["name"] == generated["metadata"]["name"]
    assert rendered["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    not_kept = one(helm_template({"crds": {"keep": False}}), "CustomResourceDefinition")
    assert "annotations" not in not_kept["metadata"]


def test_crd_can_be_left_out() -> None:
    assert not of_kind(helm_template({"crds": {"install": False}}), "CustomResourceDefinition")


def test_report_service_fronts_every_replica() -> None:
    """Headless, on the operator's pods and report port, named as the operator's --report-service flag says;
    every replica published, ready or not (the Lease, not readiness, says which one takes reports)."""
    objects = helm_template({"replicas": 2})
    service = next(s for s in of_kind(objects, "Service") if s["metadata"]["name"] == "dtrain-operator")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    container = operator_container(objects)
    assert "--report-service=dtrain-operator" in container["args"]
    assert "--report-tls-secret=dtrain-operator-report-tls" in container["args"]
    assert {"name": "reports", "containerPort": 8443, "protocol": "TCP"} in container["ports"]
    assert service["spec"]["selector"] == deployment(objects)["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "reports", "port": 8443, "targetPort": "reports", "protocol": "TCP"}]


def test_trainer_service_account_is_the_jobs_default() -> None:
    """A job that names no service account runs as the one the chart creates."""
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["trainerServiceAccount"]["name"] == contract.DEFAULT_WORKER_SERVICE_ACCOUNT


def test_service_monitor_only_where_the_monitoring_api_exists() -> None:
    values = VALUE_SETS["service-monitor"][0]
    assert not of_kind(helm_template(values), "ServiceMonitor")
    assert "no ServiceMonitor was created" in helm_notes(values)
    objects = helm_template(values, api_versions=[MONITORING_API])
    monitor = one(objects, "ServiceMonitor")
    services = {s["metadata"]["name"]: s for s in of_kind(objects, "Service")}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= services["dtrain-operator-metrics"]["metadata"]["labels"].items()
    # Not the report Service, which has no metrics port.
    assert not selector.items() <= services["dtrain-operator"]["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    # The Service reaches the operator pod's metrics port.
    service = services["dtrain-operator-metrics"]
    pod_labels = deployment(objects)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}]


def test_metrics_service_can_be_turned_off() -> None:
    values = {"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}}
    objects = helm_template(values, api_versions=[MONITORING_API])
    assert [s["metadata"]["name"] for s in of_kind(objects, "Service")] == ["dtrain-operator"]  # the report Service
    assert not of_kind(objects, "ServiceMonitor")


def test_custom_image_resources_and_placement() -> None:
    values = VALUE_SETS["custom-image-and-resources"][0]
    objects = helm_template(values)
    pod = deployment(objects)["spec"]["template"]["spec"]
    container = operator_container(objects)
    assert container["image"] == "registry.example.com/ml/dtrain-operator:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == values["resources"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["affinity"] == values["affinity"]
    assert pod["priorityClassName"] == "system-cluster-critical"


def test_image_tag_defaults_to_the_app_version() -> None:
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert operator_container(helm_template())["image"] == f"ghcr.io/dtrain-dev/dtrain-operator:{chart['appVersion']}"


def test_release_name_gives_the_object_names() -> None:
    assert deployment(helm_template(release="dtrain-operator"))["metadata"]["name"] == "dtrain-operator"
    assert deployment(helm_template(release="ml"))["metadata"]["name"] == "ml-operator"
    assert deployment(helm_template({"fullnameOverride": "trainer-ops"}))["metadata"]["name"] == "trainer-ops"


def test_notes_tell_the_next_commands() -> None:
    notes = helm_notes()
    assert "kubectl -n dtrain-system rollout status deployment/dtrain-operator" in notes
    assert "kubectl create namespace team-a" in notes and "kubectl -n team-a create serviceaccount dtrain-trainer" in notes
    assert "kubectl apply -n team-a -f examples/quickstart.yaml" in notes
    assert "examples/quickstart.yaml names no shared storage and no trainer image: set them once" in notes
    namespaced = helm_notes(VALUE_SETS["namespaced"][0])
    assert "watching: team-a, team-b" in namespaced
    assert "kubectl apply -n team-a -f examples/quickstart.yaml" in namespaced


def notes_commands(values: dict[str, Any] | None) -> list[list[str]]:
    """The kubectl lines NOTES.txt prints, split as the shell splits them."""
    return [shlex.split(line) for line in helm_notes(values).splitlines() if line.strip().startswith("kubectl ")]


@pytest.mark.parametrize("values", [None, {"trainerServiceAccount": {"namespaces": ["team-a"]}, **job_defaults()}],
                         ids=["defaults", "make cluster"])
def test_every_notes_command_names_what_the_chart_makes(values: dict[str, Any] | None) -> None:
    """Each kubectl line as printed: its namespace exists (the release's, a prepared one, or one an earlier line
    creates) and no job goes to the operator's; its Deployment is the chart's; a file it applies exists and,
    where the values give job defaults, validates against them as the operator will read them."""
    objects = helm_template(values)
    prepared = {sa["metadata"]["namespace"] for sa in of_kind(objects, "ServiceAccount")}
    deployments = {f"deployment/{d['metadata']['name']}" for d in of_kind(objects, "Deployment")}
    config = next(c for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-job-defaults"))
    defaults = parse_job_defaults(config["data"]["job-defaults.yaml"])
    commands = notes_commands(values)
    assert commands
    for words in commands:
        namespace = words[words.index("-n") + 1] if "-n" in words else None
        if words[1:3] == ["create", "namespace"]:
            prepared.add(words[3])
            continue
        if "deployment/" in " ".join(words):
            assert namespace == "dtrain-system" and next(w for w in words if w.startswith("deployment/")) in deployments
            continue
        assert namespace in prepared, words
        assert namespace != "dtrain-system", f"a job command for the operator's namespace: {words}"
        if "-f" in words:
            path = REPO / words[words.index("-f") + 1]
            result = validate_file(path, defaults=defaults, namespace=namespace)
            stated = bool(defaults.for_namespace(namespace).get("storage"))
            assert (result.errors == []) == stated, result.errors


BAD_VALUES = [
    ({"replicas": 2, "operator": {"leaderElection": {"enabled": False}}}, "/operator/leaderElection/enabled"),
    ({"replicas": 6}, "/replicas"),
    ({"replicas": "1"}, "/replicas"),
    ({"watchNamespaces": "team-a"}, "/watchNamespaces"),
    ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    ({"operator": {"logLevel": "verbose"}}, "/operator/logLevel"),
    ({"operator": {"qps": 0}}, "/operator/qps"),
    ({"operator": {"burst": 2.5}}, "/operator/burst"),
    ({"operator": {"healthPort": 80}}, "/operator/healthPort"),
    ({"operator": {"leaderElection": True}}, "/operator"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"image": {"repository": ""}}, "/image/repository"),
    # null deletes a default in Helm: the operator may not run without limits.
    ({"resources": {"limits": None}}, "/resources"),
    ({"resources": {"requests": {"cpu": "lots"}, "limits": {}}}, "/resources/requests/cpu"),
    ({"metrics": {"serviceMonitor": {"interval": "30 seconds"}}}, "/metrics/serviceMonitor/interval"),
    ({"rbac": {"create": "yes"}}, "/rbac/create"),
    ({"imagePullSecrets": ["regcred"]}, "/imagePullSecrets/0"),
    ({"trainerServiceAccount": {"name": "Trainer"}}, "/trainerServiceAccount/name"),
    ({"report": {"port": 0}}, "/report/port"),
    ({"watchNamespace": ["team-a"]}, "watchNamespace"),
]


@pytest.mark.parametrize("values,field", BAD_VALUES, ids=[json.dumps(v) for v, _ in BAD_VALUES])
def test_values_that_break_the_schema_fail_with_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(HelmError) as failure:
        helm_template(values)
    message = str(failure.value)
    assert "values don't meet the specifications of the schema" in message
    assert field in message


def test_two_replicas_elect_a_leader_and_one_without_election_recreates() -> None:
    objects = helm_template({"replicas": 2})
    dep = deployment(objects)
    assert dep["spec"]["replicas"] == 2
    args = operator_container(objects)["args"]
    parsed = cli.build_parser().parse_args(["operator", *args])
    assert parsed.leader_elect is True
    assert (parsed.leader_elect_lease_duration, parsed.leader_elect_renew_deadline, parsed.leader_elect_retry_period) == (
        10, 7, 2
    )
    assert (parsed.leader_elect_resource_name, parsed.leader_elect_resource_namespace) == ("dtrain-operator", NAMESPACE)
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in operator_container(objects)["env"]}
    assert env["POD_NAMESPACE"] == "metadata.namespace" and env["POD_ID"] == "metadata.name"
    (role,) = [r for r in of_kind(objects, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert [r.get("resourceNames") for r in role["rules"]] == [None, ["dtrain-operator"]]

    single = helm_template({"operator": {"leaderElection": {"enabled": False}}})
    assert deployment(single)["spec"]["strategy"] == {"type": "Recreate"}
    assert "--no-leader-elect" in operator_container(single)["args"]
    assert [r["metadata"]["name"] for r in of_kind(single, "Role")] == ["dtrain-operator-report-tls"]


def test_only_jobs_worker_pods_reach_the_report_port_and_no_job_reaches_metrics() -> None:
    policy = one(helm_template(), "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment(helm_template())["spec"]["selector"]["matchLabels"]
    by_port = {rule["ports"][0]["port"]: rule.get("from") for rule in policy["spec"]["ingress"]}
    assert by_port["reports"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
        contract.LABEL_ROLE: contract.ROLE_WORKER}}}]
    assert by_port["metrics"] == [{"namespaceSelector": {}, "podSelector": {"matchExpressions": [
        {"key": contract.LABEL_ROLE, "operator": "DoesNotExist"}]}}]
    assert by_port["health"] is None  # the kubelet's probes, from anywhere
    ports = {p["name"] for p in operator_container(helm_template())["ports"]}
    assert set(by_port) <= ports
    assert not of_kind(helm_template({"report": {"networkPolicy": {"enabled": False}}}), "NetworkPolicy")
