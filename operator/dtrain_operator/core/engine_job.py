"""The engine Job: `dtrain build-engine` on the ONNX model training left in artifacts.dir, after training."""

from __future__ import annotations

from typing import Any

from dtrain_operator.api import DistributedTraining, contract, engine_options, job_dirs
from dtrain_operator.core.child_names import child_metadata, engine_job_name, job_labels
from dtrain_operator.core.pod_parts import (
    CONTAINER_SECURITY,
    GPU_RESOURCE,
    POD_SECURITY,
    container_resources,
    scheduling_fields,
)
from dtrain_operator.core.storage_volumes import storage_env, storage_mounts, storage_volumes

ENGINE_CONTAINER = "engine"


def engine_command(job: DistributedTraining) -> list[str]:
    """`dtrain build-engine` on the artifacts training left in artifacts.dir."""
    artifacts = job_dirs.artifacts_dir(job.spec, job.namespace, job.name).rstrip("/")
    return [
        "dtrain",
        "build-engine",
        "--onnx",
        f"{artifacts}/{contract.ONNX_FILE_NAME}",
        "--out",
        f"{artifacts}/{contract.ENGINE_FILE_NAME}",
        "--timing-cache",
        f"{artifacts}/{contract.TIMING_CACHE_FILE_NAME}",
        "--report",
        f"{artifacts}/{contract.ENGINE_REPORT_FILE_NAME}",
        *engine_options.to_flags(engine_options.from_spec(job.spec.engine)),
    ]


def render_engine_job(job: DistributedTraining) -> dict[str, Any]:
    """batch/v1 Job `<name>-engine` that builds the TensorRT engine from model.onnx."""
    spec = job.spec
    engine = spec.engine
    resources = container_resources(engine.resources, 0) if engine.resources is not None else {"limits": {GPU_RESOURCE: 1}}
    labels = job_labels(job, contract.ROLE_ENGINE)
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER,
        "image": engine.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": engine_command(job),
        "resources": resources,
        "volumeMounts": [*storage_mounts(job), *spec.volume_mounts],
        "securityContext": dict(CONTAINER_SECURITY),
        "terminationMessagePath": contract.TERMINATION_LOG_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if storage_env(job):
        container["env"] = storage_env(job)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # The engine build needs no API access.
        "automountServiceAccountToken": False,
        "securityContext": dict(POD_SECURITY),
        "containers": [container],
        "volumes": [*storage_volumes(job), *spec.volumes],
        **{k: v for k, v in scheduling_fields(job).items() if k != "schedulerName"},
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [ref.to_wire() for ref in spec.image_pull_secrets]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": child_metadata(job, engine_job_name(job), labels),
        "spec": {
            "backoffLimit": engine.backoff_limit,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
