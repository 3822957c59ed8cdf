"""Where one job's checkpoints and artifacts are, from its whole spec (the rules: api.storage).

On a cluster, a job whose gang must share its checkpoints (more than one node) or whose engine Job
must read model.onnx needs shared storage: `missing_shared_storage` says so in one line, and
`dtrain validate`, `dtrain submit` and the operator refuse such a job, after the cluster's job defaults
(api.job_defaults) filled what it leaves unset: the CRD cannot, since the storage may come from them.
`dtrain run` does not: its nodes share this machine's disk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dtrain_operator.api import storage
from dtrain_operator.api.storage import (
    ARTIFACTS_LEAF,
    CHECKPOINTS_LEAF,
    NO_SHARED_STORAGE_FIX,
    Storage,
    is_object_url,
    is_under,
    job_dir,
    storage_root,
    url_scheme,
)

if TYPE_CHECKING:
    from dtrain_operator.api.spec import DistributedTrainingSpec


def _layout(spec: DistributedTrainingSpec) -> tuple[Storage | None, list[dict[str, Any]], tuple[str | None, str | None]]:
    return spec.storage, spec.volume_mounts, (spec.checkpoint.dir, spec.artifacts.dir)


def checkpoint_dir(spec: DistributedTrainingSpec, namespace: str, name: str) -> str:
    return spec.checkpoint.dir or job_dir(storage_root(spec.storage), namespace, name, CHECKPOINTS_LEAF)


def artifacts_dir(spec: DistributedTrainingSpec, namespace: str, name: str) -> str:
    return spec.artifacts.dir or job_dir(storage_root(spec.storage), namespace, name, ARTIFACTS_LEAF)


def pod_local_workspace(spec: DistributedTrainingSpec) -> bool:
    """Whether the operator mounts a pod-local emptyDir at /workspace (api.storage.pod_local_workspace)."""
    return storage.pod_local_workspace(*_layout(spec))


def storage_mount_path(spec: DistributedTrainingSpec) -> str | None:
    """Where the operator mounts its storage volume in the pods (api.storage.storage_mount_path)."""
    return storage.storage_mount_path(*_layout(spec))


def _is_shared(path: str, spec: DistributedTrainingSpec) -> bool:
    """A directory every pod of the job sees: object storage, the claim, or a volume the user mounted."""
    if is_object_url(path):
        return True
    mounts = [str(mount.get("mountPath", "")) for mount in spec.volume_mounts]
    storage = spec.storage
    if storage is not None and storage.claim_name is not None:
        mounts.append(storage.mount_path)
    return any(m and is_under(path, m) for m in mounts)


def missing_shared_storage(spec: DistributedTrainingSpec, namespace: str, name: str) -> str | None:
    """The one line that refuses a job whose checkpoints or artifacts must be shared but are pod-local, else None."""
    needs = []
    if spec.nodes > 1 and not _is_shared(checkpoint_dir(spec, namespace, name), spec):
        needs.append(f"its {spec.nodes} nodes must share checkpoints")
    if spec.engine.enabled and not _is_shared(artifacts_dir(spec, namespace, name), spec):
        needs.append("the engine Job must read model.onnx")
    if not needs:
        return None
    return f"spec.storage: the job has no shared storage but {' and '.join(needs)}; {NO_SHARED_STORAGE_FIX}"


def is_pod_local(spec: DistributedTrainingSpec, namespace: str, name: str) -> bool:
    """Whether the checkpoints live only as long as the pod (the pod-local emptyDir at /workspace)."""
    return not _is_shared(checkpoint_dir(spec, namespace, name), spec)


def uses_object_storage(spec: DistributedTrainingSpec, namespace: str, name: str) -> set[str]:
    """The object-storage schemes the job's directories use (empty for none)."""
    dirs = (checkpoint_dir(spec, namespace, name), artifacts_dir(spec, namespace, name))
    return {scheme for scheme in map(url_scheme, dirs) if scheme}
