"""Validate objects against the real Kubernetes OpenAPI schemas (kubernetes-validate), strictly.

Strict mode rejects unknown fields, so a misspelt field fails here instead of being dropped
by the API server. Custom resources that kubernetes-validate does not know go to crd_schemas.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate

from tests.chart.crd_schemas import has_schema, validate_custom_resource

# The oldest Kubernetes the chart is tested against, and the kubectl the tests use.
KUBERNETES_VERSIONS = ("1.33", "1.35")
# Kubernetes' own gang scheduling (gang.provider kubernetes): its PodGroup and the pods' schedulingGroup
# are 1.36's, the first release that has them.
NATIVE_GANG_VERSIONS = ("1.36",)


def describe(obj: dict[str, Any]) -> str:
    metadata = obj.get("metadata", {})
    where = f"{metadata['namespace']}/" if metadata.get("namespace") else ""
    return f"{obj.get('kind')} {where}{metadata.get('name')}"


def validate_object(obj: dict[str, Any]) -> None:
    """Raises with the object's name and the failing field when `obj` is not valid Kubernetes."""
    if has_schema(obj):
        validate_custom_resource(obj)
        return
    native_gang = obj.get("apiVersion") == "scheduling.k8s.io/v1alpha2" or "schedulingGroup" in (obj.get("spec") or {})
    for version in NATIVE_GANG_VERSIONS if native_gang else KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.absolute_path)
            message = f"{describe(obj)} is invalid in Kubernetes {version} at {path}: {error.message}"
            raise AssertionError(message) from None
