"""Where a job's checkpoints and artifacts live: a shared PVC, object storage, or the pod's own disk.

`checkpoint.dir` and `artifacts.dir` are absolute paths (without a `..` component) or object-storage URLs
(`s3://bucket/prefix`, `gs://bucket/prefix`). Left out, each is per job: `<root>/<namespace>/<name>/checkpoints` (and
`/artifacts`), where the root is `spec.storage.url`, the claim's `mountPath`, or, with no storage,
`/workspace` on a pod-local emptyDir. Two jobs never share checkpoints by default.

Where a given job's directories are, from its whole spec: api.job_dirs.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from dtrain_operator.api import contract
from dtrain_operator.api.common import MAX_PATH_LENGTH, ApiModel, DnsSubdomain
from dtrain_operator.api.kube_objects import refusal
from dtrain_operator.api.safe_yaml import echo

OBJECT_STORAGE_SCHEMES: Final = ("s3", "gs")
# A bucket name as S3 and GCS allow it (no user:password@ can hide in it), then an optional prefix.
OBJECT_URL_PATTERN: Final = r"^(s3|gs)://[a-z0-9][a-z0-9._-]{1,221}(/[^\s]*)?$"
# checkpoint.dir and artifacts.dir: an absolute path, or an object-storage URL.
DIR_PATTERN: Final = r"^(/.*|(s3|gs)://[a-z0-9][a-z0-9._-]{1,221}(/[^\s]*)?)$"
HTTP_URL_PATTERN: Final = r"^https?://[^\s/@]+(/[^\s@]*)?$"
# Where a job without spec.storage writes: an emptyDir that lives as long as the pod.
POD_LOCAL_ROOT: Final = "/workspace"
CHECKPOINTS_LEAF: Final = "checkpoints"
ARTIFACTS_LEAF: Final = "artifacts"
# The Secret keys that become the SDK's variables (spec.storage.credentialsSecret), by scheme.
S3_SECRET_KEYS: Final = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
GCS_SECRET_KEY: Final = "service-account.json"

# A '..' component makes a path name another directory than the one it reads as under (/workspace/../tmp is the
# pod's own disk): refused outright, so that the directory the storage rules judge is the one the trainer writes.
PARENT_STEP_MESSAGE: Final = "holds a '..' component, which leaves the directory it names; write the directory itself"
_PARENT_STEP_RULE: Final = {"rule": "!self.matches('(^|/)[.][.](/|$)')", "message": PARENT_STEP_MESSAGE}


def _without_parent_steps(path: str) -> str:
    if ".." in path.split("/"):
        raise ValueError(PARENT_STEP_MESSAGE)
    return path


_NO_PARENT_STEPS: Final = AfterValidator(_without_parent_steps)
# checkpoint.dir and artifacts.dir.
StorageDir = Annotated[
    str,
    Field(pattern=DIR_PATTERN, max_length=MAX_PATH_LENGTH, json_schema_extra={"x-kubernetes-validations": [_PARENT_STEP_RULE]}),
    _NO_PARENT_STEPS,
]

NO_SHARED_STORAGE_FIX: Final = (
    "set spec.storage.claimName (a ReadWriteMany PVC) or spec.storage.url (s3://bucket/prefix or gs://bucket/prefix)"
)
MOUNT_PATH_WITHOUT_CLAIM: Final = (
    "is where the claim of claimName is mounted, and no claim is named: set claimName (a ReadWriteMany PVC) "
    "or leave mountPath out"
)


def normal_path(path: str) -> str:
    """A file system path as the kernel reads it: '/data/', '/data//', '/./data' and '/x/../data' are '/data'."""
    return posixpath.normpath(re.sub("/+", "/", path))


def is_under(path: str, root: str) -> bool:
    """Whether the file system path `path` is `root` or inside it (both read as normal_path reads them)."""
    path, root = normal_path(path), normal_path(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def covered_operator_mount(path: str) -> str | None:
    """The place where the operator mounts a volume of its own (contract.OPERATOR_MOUNT_PATHS) that a mount at
    `path` would cover, or None."""
    return next((mine for mine in contract.OPERATOR_MOUNT_PATHS if is_under(path, mine)), None)


def is_object_url(path: str | None) -> bool:
    """Whether `path` names object storage (s3:// or gs://) rather than a file system path."""
    return path is not None and path.split("://", 1)[0] in OBJECT_STORAGE_SCHEMES and "://" in path


def url_scheme(path: str) -> str | None:
    return path.split("://", 1)[0] if is_object_url(path) else None


class S3Settings(ApiModel):
    """An S3-compatible service other than AWS's own (MinIO, Ceph RGW, versitygw), or an AWS region."""

    endpoint: Annotated[str, Field(pattern=HTTP_URL_PATTERN, max_length=MAX_PATH_LENGTH)] | None = None
    """The service's URL, e.g. http://minio.storage:9000 (default: AWS S3). Credentials never go here."""
    region: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9-]+$")] | None = None
    """The bucket's region, e.g. eu-west-1 (default: the SDK's, AWS_REGION or the instance's)."""


class Storage(ApiModel):
    """Where checkpoints and artifacts are shared between every worker and the engine Job: a PVC or object storage."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        # The CRD stores no defaults (api.crd): an absent mountPath is the default one.
        {"rule": f"has(self.claimName) || !has(self.mountPath) || self.mountPath == '{POD_LOCAL_ROOT}'", "message": f"mountPath {MOUNT_PATH_WITHOUT_CLAIM}"},
    ]})

    claim_name: DnsSubdomain | None = None
    """Name of a ReadWriteMany PersistentVolumeClaim in the job's namespace, mounted at mountPath."""
    mount_path: Annotated[
        str,
        Field(pattern=r"^/", max_length=MAX_PATH_LENGTH, json_schema_extra={"x-kubernetes-validations": [_PARENT_STEP_RULE]}),
        _NO_PARENT_STEPS,
    ] = POD_LOCAL_ROOT
    """Where the claim is mounted in the worker and engine containers (only with claimName)."""
    url: Annotated[str, Field(pattern=OBJECT_URL_PATTERN, max_length=MAX_PATH_LENGTH)] | None = None
    """Object storage instead of a claim: s3://bucket/prefix or gs://bucket/prefix. Checkpoints and artifacts go under <url>/<namespace>/<name>/ unless checkpoint.dir or artifacts.dir say otherwise."""
    s3: S3Settings | None = None
    """An S3-compatible endpoint and the region, for s3:// URLs."""
    credentials_secret: DnsSubdomain | None = None
    """A Secret in the job's namespace with the object store's credentials; without it the pods use their service account's (IRSA on EKS, Workload Identity on GKE). For s3:// its keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and (optional) AWS_SESSION_TOKEN become those variables; for gs:// its key service-account.json is mounted and named by GOOGLE_APPLICATION_CREDENTIALS."""

    @model_validator(mode="after")
    def _one_place(self) -> Storage:
        if self.claim_name is not None and self.url is not None:
            raise ValueError("set claimName or url, not both: checkpoints and artifacts go to one place")
        if self.claim_name is None and self.mount_path != POD_LOCAL_ROOT:
            raise refusal(".mountPath", MOUNT_PATH_WITHOUT_CLAIM)
        covered = covered_operator_mount(self.mount_path)
        if covered is not None:
            raise refusal(".mountPath", f"{echo(self.mount_path)} would cover {covered}, where dtrain mounts "
                          f"{contract.OPERATOR_MOUNT_PATHS[covered]}; mount the claim elsewhere")
        return self


def job_dir(root: str, namespace: str, name: str, leaf: str) -> str:
    """`<root>/<namespace>/<name>/<leaf>`: the per-job default of checkpoint.dir and artifacts.dir."""
    return f"{root.rstrip('/')}/{namespace}/{name}/{leaf}"


class CheckpointOwner(ApiModel):
    """The job a checkpoint belongs to, written into every checkpoint: the trainer resumes only from its own."""

    namespace: str
    name: str
    uid: str | None = None
    """The DistributedTraining's uid (none under `dtrain run`): a job deleted and created again has another."""
    training_hash: str
    """`training_hash` of the config that wrote it: a changed model, data or trainer setting changes it."""

    def mismatch(self, other: CheckpointOwner) -> str | None:
        """Why a checkpoint of `other` is not this job's, or None when it is."""
        if (other.namespace, other.name) != (self.namespace, self.name):
            return f"it belongs to the job {other.namespace}/{other.name}"
        if other.uid is not None and self.uid is not None and other.uid != self.uid:
            return f"it belongs to an earlier job named {other.namespace}/{other.name} (uid {other.uid}), deleted since"
        if other.training_hash != self.training_hash:
            return "it was written by this job with another model, data or trainer spec"
        return None


class SurvivorMark(ApiModel):
    """In a checkpoint that a surviving rank wrote after a peer of its gang was lost (dtrain_trainer.survivor)."""

    rank: int
    """The global rank that wrote it."""
    step: int
    """The optimizer step it holds: the last one the gang completed."""
    error: str | None = None
    """The collective's error that told the survivor a peer was lost (the first line, shortened)."""


def storage_root(storage: Storage | None) -> str:
    """What the per-job default directories are under: the object-storage URL, the claim's mount, or the pod's disk."""
    if storage is not None and storage.url is not None:
        return storage.url
    if storage is not None and storage.claim_name is not None:
        return storage.mount_path
    return POD_LOCAL_ROOT


def pod_local_workspace(
    storage: Storage | None, volume_mounts: Sequence[Mapping[str, Any]], dirs: tuple[str | None, str | None]
) -> bool:
    """No claim, no volume of the job's own mounted at /workspace, and checkpoint.dir or artifacts.dir (`dirs`) under
    it (so set, or by default without storage.url): the operator mounts an emptyDir there, which the non-root trainer
    can write."""
    if storage is not None and storage.claim_name is not None:
        return False
    if any(normal_path(str(mount.get("mountPath", ""))) == POD_LOCAL_ROOT for mount in volume_mounts):
        return False
    # A per-job default directory is under storage_root: the object-storage URL or /workspace.
    resolved = [given or storage_root(storage) for given in dirs]
    return any(not is_object_url(d) and is_under(d, POD_LOCAL_ROOT) for d in resolved)


def storage_mount_path(
    storage: Storage | None, volume_mounts: Sequence[Mapping[str, Any]], dirs: tuple[str | None, str | None]
) -> str | None:
    """Where the operator mounts its storage volume (contract.STORAGE_VOLUME) in the pods: the claim's mountPath,
    /workspace for the pod-local emptyDir, or None when it adds none."""
    if storage is not None and storage.claim_name is not None:
        return storage.mount_path
    return POD_LOCAL_ROOT if pod_local_workspace(storage, volume_mounts, dirs) else None
