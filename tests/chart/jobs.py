"""DistributedTrainings whose rendered children the chart tests check: the examples, and variants
of the quick start for the renderings the examples do not reach (gang scheduling, host network, ...)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from dtrain_operator.api import DistributedTraining
from dtrain_operator.api.validation import validate_file

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))

# Deep-merged into examples/quickstart.yaml.
VARIANTS: dict[str, dict[str, Any]] = {
    "gang-volcano": {
        "spec": {
            "scheduling": {"schedulerName": "volcano", "priorityClassName": "training-high", "gang": {"enabled": True}}
        }
    },
    "gang-coscheduling": {
        "spec": {
            "nodes": 3,
            "scheduling": {
                "schedulerName": "scheduler-plugins-scheduler",
                "gang": {"enabled": True, "minAvailable": 2, "scheduleTimeoutSeconds": 120},
            },
        }
    },
    "gang-kubernetes": {"spec": {"nodes": 2, "scheduling": {"gang": {"enabled": True, "provider": "kubernetes"}}}},
    "gpu-host-network": {
        "metadata": {"namespace": "research"},
        "spec": {
            "accelerator": "gpu",
            "devicesPerNode": 8,
            "hostNetwork": True,
            "serviceAccountName": "research-trainer",
            "imagePullPolicy": "Always",
            "imagePullSecrets": [{"name": "regcred"}],
            "resources": {"requests": {"cpu": "32", "memory": "256Gi"}, "limits": {"memory": "256Gi"}},
            "env": [
                {"name": "HF_HOME", "value": "/workspace/hf"},
                {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}},
            ],
            "nccl": {"ibDisable": False, "socketIfname": "eth0", "debug": "INFO"},
            "storage": {"claimName": "workspace", "mountPath": "/workspace"},
            "engine": {"enabled": True, "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "32Gi"}}},
            "scheduling": {
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "affinity": {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "labelSelector": {"matchLabels": {"dtrain.dev/job-name": "quickstart"}},
                                "topologyKey": "kubernetes.io/hostname",
                            }
                        ]
                    }
                },
            },
        },
    },
}


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def example_jobs() -> dict[str, DistributedTraining]:
    """Every DistributedTraining in examples/*.yaml, by file name."""
    jobs: dict[str, DistributedTraining] = {}
    for path in EXAMPLES:
        # As `dtrain run` reads them: the quick start and lit-model have no spec.storage, which a cluster asks for
        # (tests/unit/test_storage.py); their pods render with the pod-local emptyDir, still worth checking.
        result = validate_file(path, cluster=False)
        assert not result.errors, f"{result.source}: {result.errors}"
        assert result.job is not None
        jobs[Path(result.source).name] = result.job
    return jobs


def variant_jobs() -> dict[str, DistributedTraining]:
    quickstart = yaml.safe_load((REPO_ROOT / "examples" / "quickstart.yaml").read_text())
    return {name: DistributedTraining.model_validate(_merge(quickstart, patch)) for name, patch in VARIANTS.items()}


def all_jobs() -> dict[str, DistributedTraining]:
    return {**example_jobs(), **variant_jobs()}
