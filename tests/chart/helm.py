"""Render and lint the Helm chart with the real `helm` binary.

`make test` installs helm and kubectl into .tools/bin (tools/install-k8s-tools.sh); where they
are absent, the tests that need them are skipped with that reason. Other test packages import
`helm_template` and `rbac_rules` from here (the operator's RBAC test compares the chart's rules
with the API calls recorded from a run of the operator).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "dtrain-operator"
TOOLS_BIN = REPO_ROOT / ".tools" / "bin"
MONITORING_API = "monitoring.coreos.com/v1"
NAMESPACE = "dtrain-system"


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr."""


def tool(name: str) -> str:
    """Path of `helm` or `kubectl`: .tools/bin first, then PATH; skips the test when neither has it."""
    local = TOOLS_BIN / name
    if os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed: run `bash tools/install-k8s-tools.sh` (make test does)")
    return found


def _run_helm(args: list[str], values: dict[str, Any] | None) -> str:
    with tempfile.TemporaryDirectory(prefix="dtrain-chart-") as tmp:
        command = [tool("helm"), *args]
        if values:
            values_file = Path(tmp) / "values.yaml"
            values_file.write_text(json.dumps(values))  # JSON is YAML
            command += ["--values", str(values_file)]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0:
        raise HelmError(result.stderr.strip() or result.stdout.strip())
    return result.stdout


@functools.lru_cache(maxsize=64)
def _template_cached(values_json: str, namespace: str, release: str, api_versions: tuple[str, ...]) -> str:
    args = ["template", release, str(CHART_DIR), "--namespace", namespace]
    for api_version in api_versions:
        args += ["--api-versions", api_version]
    return _run_helm(args, json.loads(values_json))


def helm_template(
    values: dict[str, Any] | None = None,
    namespace: str = "dtrain-system",
    release: str = "dtrain",
    api_versions: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """The chart rendered by `helm template` with these values, as parsed objects.

    `api_versions` are extra APIs the pretend cluster serves (e.g. MONITORING_API).
    Raises HelmError, naming the value, when the values break values.schema.json.
    """
    text = _template_cached(json.dumps(values or {}, sort_keys=True), namespace, release, tuple(api_versions))
    return [copy.deepcopy(obj) for obj in yaml.safe_load_all(text) if obj]


def helm_lint(values: dict[str, Any] | None = None, namespace: str = "dtrain-system") -> str:
    """`helm lint --strict` of the chart with these values; its output. Raises HelmError on failure."""
    return _run_helm(["lint", "--strict", str(CHART_DIR), "--namespace", namespace], values)


def helm_notes(values: dict[str, Any] | None = None, namespace: str = "dtrain-system") -> str:
    """NOTES.txt as `helm install` prints it (a client-side dry run, no cluster)."""
    output = _run_helm(["install", "dtrain", str(CHART_DIR), "--dry-run=client", "--namespace", namespace], values)
    return output.split("NOTES:", 1)[1] if "NOTES:" in output else ""


def of_kind(objects: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = of_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return one(objects, "Deployment")


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = deployment(objects)["spec"]["template"]["spec"]["containers"]
    return container


RBAC_LABEL = "dtrain.dev/rbac"  # "operator" or "trainer" on every role and binding the chart renders


def rbac_rules(objects: Iterable[dict[str, Any]], component: str = "operator") -> list[dict[str, Any]]:
    """The rules of every ClusterRole and Role the chart renders for `component` ("operator" or "trainer").

    Each rule is returned as rendered ({apiGroups, resources, verbs}); a namespaced install renders
    the same rules in a Role per watched namespace, so duplicates are kept out.
    """
    rules: list[dict[str, Any]] = []
    for obj in objects:
        if obj["kind"] in ("ClusterRole", "Role") and obj["metadata"]["labels"].get(RBAC_LABEL) == component:
            rules.extend(rule for rule in obj.get("rules", []) if rule not in rules)
    return rules


def granted(rules: Iterable[dict[str, Any]]) -> set[tuple[str, str, str]]:
    """Every (apiGroup, resource, verb) the rules grant; "" is the core group, "pods/status" a subresource."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }
