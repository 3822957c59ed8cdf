"""The value sets every chart test renders: the defaults and the installs users ask for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.chart.helm import MONITORING_API

HARDENED = yaml.safe_load((Path(__file__).resolve().parents[2] / "helm/dtrain-operator/values-hardened.yaml").read_text())

# name -> (values, extra API versions the pretend cluster serves)
VALUE_SETS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "defaults": ({}, ()),
    "hardened": (HARDENED, ()),
    "namespaced": ({"watchNamespaces": ["team-a", "team-b"]}, ()),
    "no-rbac": (
        {
            "rbac": {"create": False},
            "trainerServiceAccount": {"create": False},
            "serviceAccount": {"create": False, "name": "platform-operator"},
            "crds": {"install": False},
        },
        (),
    ),
    "service-monitor": (
        {"metrics": {"serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}}}},
        (MONITORING_API,),
    ),
    # `helm install --set metrics.serviceMonitor.enabled=true,metrics.dashboard.enabled=true`, with
    # the dashboard where a central Grafana's sidecar looks, in a folder.
    "monitoring": (
        {
            "metrics": {
                "serviceMonitor": {"enabled": True},
                "dashboard": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "dtrain"}},
            }
        },
        (MONITORING_API,),
    ),
    "custom-image-and-resources": (
        {
            "image": {"repository": "registry.example.com/ml/dtrain-operator", "tag": "1.2.3", "pullPolicy": "Always"},
            "imagePullSecrets": [{"name": "regcred"}],
            "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": 2, "memory": "1Gi"}},
            "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
            "tolerations": [
                {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}
                        ]
                    }
                }
            },
            "priorityClassName": "system-cluster-critical",
            "operator": {"logLevel": "DEBUG", "logFormat": "json", "qps": 50, "burst": 100, "watchTimeout": 120},
            "trainerServiceAccount": {"namespaces": ["research"]},
        },
        (),
    ),
}
