"""Security by default: the operator's pod and the worker pods it renders.

The operator pod must meet the Kubernetes "restricted" Pod Security Standard with every value set;
worker and engine pods must too, except for the host network a job asks for explicitly.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import tomllib
import yaml

from dtrain_operator.api import contract
from dtrain_operator.core.render import render_children
from tests.chart.helm import CHART_DIR, REPO_ROOT, helm_template, one
from tests.chart.jobs import all_jobs
from tests.chart.value_sets import VALUE_SETS

JOBS = all_jobs()

# Volume types the "restricted" Pod Security Standard allows.
RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod_spec: dict[str, Any]) -> list[str]:
    """What in a pod spec breaks the "restricted" Pod Security Standard (as the admission plugin checks it)."""
    problems = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            problems.append(f"{field} is true")
    pod_context = pod_spec.get("securityContext", {})
    for volume in pod_spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume['name']} is of type {sorted(kinds)}")
    containers = pod_spec.get("containers", []) + pod_spec.get("initContainers", [])
    for container in containers:
        name = container["name"]
        context = container.get("securityContext", {})
        if context.get("privileged"):
            problems.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{name}: does not drop ALL capabilities")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{name}: adds capabilities {capabilities['add']}")
        if not context.get("runAsNonRoot", pod_context.get("runAsNonRoot")):
            problems.append(f"{name}: runAsNonRoot is not true")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            problems.append(f"{name}: runs as user 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{name}: seccompProfile is {seccomp!r}")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            problems.append(f"{name}: uses a hostPort")
    return problems


# --- The operator -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_operator_pod_is_restricted_and_hardened(name: str) -> None:
    values, api_versions = VALUE_SETS[name]
    pod = one(helm_template(values, api_versions=api_versions), "Deployment")["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # A read-only root filesystem still needs somewhere to write temporary files.
    (tmp,) = [mount for mount in container["volumeMounts"] if mount["mountPath"] == "/tmp"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == tmp["name"]]
    assert "emptyDir" in volume
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind]), kind


def test_operator_runs_as_the_images_user() -> None:
    dockerfile = (REPO_ROOT / "operator" / "Dockerfile").read_text()
    (user,) = re.findall(r"^USER (\d+)(?::\d+)?$", dockerfile, re.MULTILINE)
    pod = one(helm_template(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(user) != 0


def test_operator_image_installs_only_the_operator_extra() -> None:
    dockerfile = (REPO_ROOT / "operator" / "Dockerfile").read_text()
    assert re.findall(r"'(?:\.|dtrain)\[(\w+)\]'", dockerfile) == ["operator", "operator"]
    assert 'ENTRYPOINT ["dtrain", "operator"]' in dockerfile
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not [dep for dep in extras["operator"] if re.match(r"(torch|lightning|onnx|tensorrt)", dep)]


def test_operator_service_account_token_is_mounted() -> None:
    """The operator talks to the API server: its token must not be switched off."""
    pod = one(helm_template(), "Deployment")["spec"]["template"]["spec"]
    assert pod.get("automountServiceAccountToken", True) is True


def test_chart_defaults_are_the_hardened_ones() -> None:
    """values.yaml states the hardening, so `helm show values` shows it to the user."""
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["securityContext"]["readOnlyRootFilesystem"] is True
    assert values["podSecurityContext"]["runAsNonRoot"] is True
    assert values["resources"]["limits"] and values["resources"]["requests"]


# --- The worker and engine pods the operator renders -----------------------------------------------


def _pod_specs(job_name: str) -> list[tuple[str, dict[str, Any]]]:
    specs = []
    for obj in render_children(JOBS[job_name]):
        if obj["kind"] == "Pod":
            specs.append((obj["metadata"]["name"], obj["spec"]))
        elif obj["kind"] == "Job":
            specs.append((obj["metadata"]["name"], obj["spec"]["template"]["spec"]))
    return specs


@pytest.mark.parametrize("job_name", JOBS)
def test_worker_and_engine_pods_are_restricted_unless_the_job_asks_for_the_host_network(job_name: str) -> None:
    job = JOBS[job_name]
    for name, spec in _pod_specs(job_name):
        violations = restricted_violations(spec)
        if job.spec.host_network and spec.get("hostNetwork"):
            # The one exception a job may ask for (some NCCL/RDMA setups): and nothing else.
            assert violations == ["hostNetwork is true"], name
        else:
            assert violations == [], name
        for container in spec["containers"]:
            assert container["securityContext"].get("privileged") is False, name


@pytest.mark.parametrize("job_name", JOBS)
def test_host_network_only_when_the_spec_asks(job_name: str) -> None:
    job = JOBS[job_name]
    for obj in render_children(job):
        if obj["kind"] == "Pod":
            assert obj["spec"].get("hostNetwork", False) is job.spec.host_network
            if job.spec.host_network:
                # Keep cluster DNS (rank 0's name) working in the host's network namespace.
                assert obj["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
        elif obj["kind"] == "Job":
            assert "hostNetwork" not in obj["spec"]["template"]["spec"]


@pytest.mark.parametrize("job_name", JOBS)
def test_workers_run_as_their_own_service_account(job_name: str) -> None:
    job = JOBS[job_name]
    for obj in render_children(job):
        if obj["kind"] == "Pod":
            assert obj["spec"]["serviceAccountName"] == job.spec.service_account_name != "default"
        elif obj["kind"] == "Job":
            # The engine build needs no API access at all.
            assert obj["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_default_worker_service_account_is_the_one_the_chart_creates() -> None:
    quickstart = JOBS["quickstart.yaml"]
    assert quickstart.spec.service_account_name == contract.DEFAULT_WORKER_SERVICE_ACCOUNT
    accounts = {
        (obj["metadata"]["namespace"], obj["metadata"]["name"])
        for obj in helm_template({"trainerServiceAccount": {"namespaces": ["team-a"]}}) if obj["kind"] == "ServiceAccount"
    }
    assert ("team-a", contract.DEFAULT_WORKER_SERVICE_ACCOUNT) in accounts


def test_restricted_check_catches_what_it_claims() -> None:
    """The checker itself: each kind of violation is reported."""
    (_, spec) = _pod_specs("quickstart.yaml")[0]
    spec = yaml.safe_load(yaml.safe_dump(spec))
    spec["hostPID"] = True
    spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    container = spec["containers"][0]
    container["securityContext"] = {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}, "runAsUser": 0}
    container["ports"][0]["hostPort"] = 29500
    spec["securityContext"] = {}
    assert restricted_violations(spec) == [
        "hostPID is true",
        "volume host is of type ['hostPath']",
        "trainer: privileged",
        "trainer: allowPrivilegeEscalation is not false",
        "trainer: does not drop ALL capabilities",
        "trainer: adds capabilities ['SYS_ADMIN']",
        "trainer: runAsNonRoot is not true",
        "trainer: runs as user 0",
        "trainer: seccompProfile is None",
        "trainer: uses a hostPort",
    ]
