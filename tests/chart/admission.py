"""The chart's ValidatingAdmissionPolicies, evaluated by a real CEL engine as the API server evaluates them.

Google's CEL runtime (cel-expr-python) compiles and evaluates every expression of a policy
against admission requests. Variables are declared as Kubernetes declares them for admission
policies (object, oldObject, request, params, and the policy's own `variables`, each computed in
order); the chart's policies use no Kubernetes-specific CEL functions.
"""

from __future__ import annotations

from typing import Any

import pytest

cel = pytest.importorskip("cel_expr_python.cel", reason="cel-expr-python is in the dev extra")

from tests.chart.helm import helm_template

ENV = cel.NewEnv(variables={name: cel.Type.DYN for name in ("object", "oldObject", "request", "params", "variables")})


def chart_policy(component: str, kind: str = "ValidatingAdmissionPolicy") -> dict[str, Any]:
    """The chart's policy (or its binding) of one component (`trainer`, `operator`)."""
    return next(
        o for o in helm_template()
        if o["kind"] == kind and o["metadata"]["labels"].get("app.kubernetes.io/component") == component
    )


def admit(policy: dict[str, Any], request: dict[str, Any], old: Any, new: Any) -> tuple[bool, list[str]]:
    """(allowed, messages) as the API server decides one request under `policy`."""
    spec = policy["spec"]
    data: dict[str, Any] = {"object": new, "oldObject": old, "request": request, "params": None, "variables": {}}
    for variable in spec.get("variables", []):
        data["variables"] = {**data["variables"], variable["name"]: ENV.compile(variable["expression"]).eval(data=data).value()}
    if not all(ENV.compile(c["expression"]).eval(data=data).value() for c in spec["matchConditions"]):
        return True, []
    failed = [v["message"] for v in spec["validations"] if not ENV.compile(v["expression"]).eval(data=data).value()]
    return not failed, failed


def compile_all(policy: dict[str, Any]) -> None:
    spec = policy["spec"]
    for item in spec["matchConditions"] + spec.get("variables", []) + spec["validations"]:
        ENV.compile(item["expression"])
