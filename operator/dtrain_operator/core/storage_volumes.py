"""Where a pod's checkpoints and artifacts go: the claim, a pod-local emptyDir, or object storage (pure).

A claim is mounted at its mountPath. With no claim, a directory under /workspace gets an emptyDir there,
which the non-root trainer can write (it dies with the pod: the operator says so in a condition). For
s3:// and gs:// directories the SDK's variables are set: the endpoint and region from spec.storage.s3,
and, with spec.storage.credentialsSecret, the credentials as references to the Secret (secretKeyRef, a
mounted key), never as values; without it the SDK uses the pod's service account (IRSA, Workload Identity).
"""

from __future__ import annotations

from typing import Any

from dtrain_operator.api import DistributedTraining, contract, job_dirs, storage

STORAGE_VOLUME = contract.STORAGE_VOLUME
# botocore (boto3, s3fs) reads the S3 endpoint from this variable.
S3_ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL_S3"


def _var(name: str, value: Any) -> dict[str, Any]:
    return {"name": name, "value": str(value)}


def object_store_env(job: DistributedTraining) -> dict[str, str]:
    """The object-storage SDK's plain variables (the endpoint and region), the same in a pod and in `dtrain run`."""
    settings = job.spec.storage
    schemes = job_dirs.uses_object_storage(job.spec, job.namespace, job.name)
    env: dict[str, str] = {}
    if settings is not None and "s3" in schemes and settings.s3 is not None:
        if settings.s3.endpoint:
            env[S3_ENDPOINT_VARIABLE] = settings.s3.endpoint
        if settings.s3.region:
            env.update(dict.fromkeys(("AWS_REGION", "AWS_DEFAULT_REGION"), settings.s3.region))
    return env


def credentials_env(job: DistributedTraining) -> list[dict[str, Any]]:
    """A pod's object-storage credentials from spec.storage.credentialsSecret, as references, never values.

    Only a pod has them: `dtrain run` uses the caller's own credentials."""
    settings = job.spec.storage
    secret = settings.credentials_secret if settings is not None else None
    if not secret:
        return []
    schemes = job_dirs.uses_object_storage(job.spec, job.namespace, job.name)
    env: list[dict[str, Any]] = []
    if "s3" in schemes:
        for key in storage.S3_SECRET_KEYS:
            optional = key == "AWS_SESSION_TOKEN"
            env.append({"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": optional}}})
    if "gs" in schemes:
        env.append(_var("GOOGLE_APPLICATION_CREDENTIALS", f"{contract.GCS_CREDENTIALS_DIR}/{storage.GCS_SECRET_KEY}"))
    return env


def storage_env(job: DistributedTraining) -> list[dict[str, Any]]:
    """A container's object-storage variables: the plain ones, then the credentials."""
    return [*(_var(name, value) for name, value in object_store_env(job).items()), *credentials_env(job)]


def _gcs_credentials(job: DistributedTraining) -> str | None:
    settings = job.spec.storage
    if settings is None or not settings.credentials_secret:
        return None
    return settings.credentials_secret if "gs" in job_dirs.uses_object_storage(job.spec, job.namespace, job.name) else None


def storage_volumes(job: DistributedTraining) -> list[dict[str, Any]]:
    settings = job.spec.storage
    volumes: list[dict[str, Any]] = []
    if settings is not None and settings.claim_name is not None:
        volumes.append({"name": STORAGE_VOLUME, "persistentVolumeClaim": {"claimName": settings.claim_name}})
    elif job_dirs.pod_local_workspace(job.spec):
        volumes.append({"name": STORAGE_VOLUME, "emptyDir": {}})
    secret = _gcs_credentials(job)
    if secret:
        volumes.append({"name": contract.GCS_CREDENTIALS_VOLUME, "secret": {"secretName": secret, "items": [
            {"key": storage.GCS_SECRET_KEY, "path": storage.GCS_SECRET_KEY}]}})
    return volumes


def storage_mounts(job: DistributedTraining) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = []
    mount_path = job_dirs.storage_mount_path(job.spec)
    if mount_path is not None:
        mounts.append({"name": STORAGE_VOLUME, "mountPath": mount_path})
    if _gcs_credentials(job):
        mounts.append({"name": contract.GCS_CREDENTIALS_VOLUME, "mountPath": contract.GCS_CREDENTIALS_DIR, "readOnly": True})
    return mounts
