"""Gang scheduling: the PodGroup of Kubernetes' own API, Volcano's or scheduler-plugins' (spec.scheduling.gang)."""

from __future__ import annotations

from typing import Any

from dtrain_operator.api import DistributedTraining, contract
from dtrain_operator.core.child_names import child_metadata, job_labels, pod_group_name

VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"


COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


NATIVE_POD_GROUP_API = "scheduling.k8s.io/v1alpha2"  # Kubernetes' own gang scheduling (1.36 alpha)


def render_pod_group(job: DistributedTraining) -> dict[str, Any] | None:
    """A PodGroup for gang scheduling (Kubernetes', Volcano's or scheduler-plugins'), or None when not asked for."""
    gang, provider = job.spec.scheduling.gang, job.spec.scheduling.gang_provider
    if provider is None:
        return None
    min_member = gang.min_available if gang.min_available is not None else job.spec.nodes
    metadata = child_metadata(job, pod_group_name(job), job_labels(job, contract.ROLE_WORKER))
    if provider == "kubernetes":
        # The pods' spec.schedulingGroup names it; it needs no Workload (podGroupTemplateRef is optional).
        spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_member}}}
        return {"apiVersion": NATIVE_POD_GROUP_API, "kind": "PodGroup", "metadata": metadata, "spec": spec}
    if provider == "volcano":
        spec = {"minMember": min_member}
        if job.spec.scheduling.priority_class_name:
            spec["priorityClassName"] = job.spec.scheduling.priority_class_name
        return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": metadata, "spec": spec}
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": metadata,
        "spec": {"minMember": min_member, "scheduleTimeoutSeconds": gang.schedule_timeout_seconds},
    }
