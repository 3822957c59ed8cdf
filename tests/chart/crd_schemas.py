"""Schemas for the custom resources that kubernetes-validate does not know (it has built-in kinds only).

Each covers the fields of the upstream CRD at the version named, and rejects unknown fields like
kubernetes-validate's strict mode, so that a typo in what the operator or the chart renders fails.
"""

from __future__ import annotations

from typing import Any

import jsonschema

_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
_QUANTITY = {
    "anyOf": [
        {"type": "string", "pattern": r"^[+-]?[0-9.]+([eE][-+]?[0-9]+|[mkMGTPE]|[KMGTPE]i)?$"},
        {"type": "number"},
    ]
}
_RESOURCE_LIST = {"type": "object", "additionalProperties": _QUANTITY}
# Prometheus Operator's Duration type.
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}


def _custom_resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "pattern": _DNS_SUBDOMAIN, "maxLength": 253},
                    "namespace": {"type": "string", "pattern": _DNS_LABEL, "maxLength": 63},
                    "labels": _STRING_MAP,
                    "annotations": _STRING_MAP,
                    "ownerReferences": {"type": "array", "items": {"type": "object"}},
                },
            },
            "spec": spec,
        },
    }


SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    # Volcano's PodGroup (volcano.sh/apis, scheduling/v1beta1).
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): _custom_resource(
        "scheduling.volcano.sh/v1beta1",
        "PodGroup",
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "minMember": {**_INT32, "minimum": 0},
                "minTaskMember": {"type": "object", "additionalProperties": _INT32},
                "minResources": _RESOURCE_LIST,
                "priorityClassName": {"type": "string"},
                "queue": {"type": "string"},
                "networkTopology": {"type": "object"},
            },
        },
    ),
    # scheduler-plugins' coscheduling PodGroup (sigs.k8s.io/scheduler-plugins, v1alpha1).
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): _custom_resource(
        "scheduling.x-k8s.io/v1alpha1",
        "PodGroup",
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "minMember": {**_INT32, "minimum": 0},
                "minResources": _RESOURCE_LIST,
                "scheduleTimeoutSeconds": {**_INT32, "minimum": 0},
            },
        },
    ),
    # The Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1).
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _custom_resource(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector"],
            "properties": {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "sampleLimit": {"type": "integer", "minimum": 0},
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "params": {"type": "object"},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "honorTimestamps": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": {"type": "object"}},
                            "metricRelabelings": {"type": "array", "items": {"type": "object"}},
                            "tlsConfig": {"type": "object"},
                            "authorization": {"type": "object"},
                            "basicAuth": {"type": "object"},
                            "oauth2": {"type": "object"},
                            "followRedirects": {"type": "boolean"},
                            "enableHttp2": {"type": "boolean"},
                            "filterRunning": {"type": "boolean"},
                            "proxyUrl": {"type": "string"},
                        },
                    },
                },
            },
        },
    ),
}


def has_schema(obj: dict[str, Any]) -> bool:
    return (obj.get("apiVersion"), obj.get("kind")) in SCHEMAS


def validate_custom_resource(obj: dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError when `obj` breaks its CRD's schema."""
    jsonschema.Draft202012Validator(SCHEMAS[(obj["apiVersion"], obj["kind"])]).validate(obj)
