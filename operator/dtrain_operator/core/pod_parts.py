"""What every pod the operator renders shares (workers, standbys, the engine Job's): its security contexts, its
resources and where it may be placed."""

from __future__ import annotations

from typing import Any

from dtrain_operator.api import DistributedTraining, Resources, contract

GPU_RESOURCE = "nvidia.com/gpu"


def container_resources(resources: Resources | None, gpus: int) -> dict[str, Any]:
    out = resources.to_wire() if resources is not None else {}
    if gpus:
        # GPUs are requested through limits; Kubernetes copies them to requests.
        out.setdefault("limits", {})[GPU_RESOURCE] = gpus
        out.get("requests", {}).pop(GPU_RESOURCE, None)
    return {k: v for k, v in out.items() if v}


CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
}


POD_SECURITY = {
    "runAsNonRoot": True,
    # The trainer image's own user (trainer_image/Dockerfile): stated, so that the kubelet need not
    # read the image's USER (an image built FROM a root base runs as this user, or is refused at
    # once by the image's own check, instead of CreateContainerConfigError minutes later).
    "runAsUser": contract.WORKLOAD_UID,
    "runAsGroup": contract.WORKLOAD_GID,
    "seccompProfile": {"type": "RuntimeDefault"},
    "fsGroup": contract.WORKLOAD_UID,
    # Only when the volume's root does not match yet: a recursive chown of a data set is slow.
    "fsGroupChangePolicy": "OnRootMismatch",
}


def _same_domain(job: DistributedTraining, gang_generation: int, affinity: dict[str, Any] | None) -> dict[str, Any]:
    """The pods' affinity with scheduling.topology.required: each worker of this gang generation in the
    domain of the others (the first one placed anywhere, as the scheduler allows a pod that matches its
    own term), added to the job's own affinity. Per generation: a restarted gang chooses afresh."""
    own = {"matchLabels": {contract.LABEL_JOB_NAME: job.name, contract.LABEL_GANG_GENERATION: str(gang_generation)}}
    term = {"labelSelector": own, "topologyKey": job.spec.scheduling.topology.required}
    merged = dict(affinity or {})
    pod_affinity = dict(merged.get("podAffinity") or {})
    required = [*(pod_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or []), term]
    merged["podAffinity"] = {**pod_affinity, "requiredDuringSchedulingIgnoredDuringExecution": required}
    return merged


def scheduling_fields(job: DistributedTraining, gang_generation: int | None = None) -> dict[str, Any]:
    """Where the pods go; with a gang generation (the workers), the gang's topology domain too."""
    scheduling = job.spec.scheduling
    fields: dict[str, Any] = {}
    if scheduling.scheduler_name:
        fields["schedulerName"] = scheduling.scheduler_name
    if scheduling.priority_class_name:
        fields["priorityClassName"] = scheduling.priority_class_name
    if scheduling.node_selector:
        fields["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        fields["tolerations"] = list(scheduling.tolerations)
    if scheduling.affinity:
        fields["affinity"] = scheduling.affinity
    if gang_generation is not None and scheduling.topology.required:
        fields["affinity"] = _same_domain(job, gang_generation, scheduling.affinity)
    return fields
