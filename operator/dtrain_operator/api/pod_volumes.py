"""A job's own volumes and mounts beside those the operator adds to its pods (core.render, core.storage_volumes).

The API server refuses a pod with two volumes of one name or two mounts at one path ("must be unique"), and
a mount that covers one of the operator's would hide the trainer's config or token: either way no pod is
created, or the trainer fails in it. So `dtrain validate` refuses them first, naming the field and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dtrain_operator.api import contract
from dtrain_operator.api.kube_objects import Problem
from dtrain_operator.api.safe_yaml import echo
from dtrain_operator.api.storage import covered_operator_mount, normal_path


def _volume_names_problem(volumes: Sequence[Mapping[str, Any]]) -> Problem | None:
    names: set[str] = set()
    for index, volume in enumerate(volumes):
        name = volume["name"]
        if name in contract.OPERATOR_VOLUMES:
            return f".volumes[{index}].name", (f"{echo(name)} is the name of a volume the operator adds "
                                               f"({', '.join(contract.OPERATOR_VOLUMES)}); choose another")
        if name in names:
            return f".volumes[{index}].name", f"{echo(name)} names two volumes; give each volume its own name"
        names.add(name)
    return None


def pod_volumes_problem(
    volumes: Sequence[Mapping[str, Any]], volume_mounts: Sequence[Mapping[str, Any]], storage_path: str | None
) -> Problem | None:
    """The first of spec.volumes and spec.volumeMounts that collides with another or with the operator's own;
    `storage_path` is where the operator mounts the job's storage (api.storage.storage_mount_path)."""
    problem = _volume_names_problem(volumes)
    if problem is not None:
        return problem
    mountable = {volume["name"] for volume in volumes} | ({contract.STORAGE_VOLUME} if storage_path else set())
    taken: dict[str, str] = {}
    for index, mount in enumerate(volume_mounts):
        at = f".volumeMounts[{index}]"
        if mount["name"] not in mountable:
            return f"{at}.name", (f"{echo(mount['name'])} names no volume of spec.volumes"
                                  + (" or spec.storage" if storage_path else ""))
        path = normal_path(mount["mountPath"])
        covered = covered_operator_mount(path)
        if covered is not None:
            return f"{at}.mountPath", (f"{echo(mount['mountPath'])} would cover {covered}, where the operator mounts "
                                       f"{contract.OPERATOR_MOUNT_PATHS[covered]}; mount it elsewhere")
        # Only the claim's: the pod-local emptyDir makes way for a volume of the job's own at /workspace.
        if storage_path is not None and path == normal_path(storage_path):
            return f"{at}.mountPath", (f"{echo(mount['mountPath'])} is where dtrain mounts the job's storage "
                                       "(spec.storage.mountPath); mount elsewhere")
        if path in taken:
            return f"{at}.mountPath", (f"{echo(mount['mountPath'])} is already the mountPath of {taken[path]}; "
                                       "give each mount its own path")
        taken[path] = f"spec.volumeMounts[{index}]"
    return None
