"""The names and labels of a job's children: one place, so that the operator, `dtrain run` and the status agree."""

from __future__ import annotations

from typing import Any

from dtrain_operator.api import DistributedTraining, contract
from dtrain_operator.core import queueing

# Where a worker names its PodGroup: Volcano reads an annotation, scheduler-plugins a label.
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"

def service_name(job: DistributedTraining) -> str:
    return job.name


def worker_hostname(job: DistributedTraining, rank: int) -> str:
    """Rank `rank`'s DNS name in the job's Service, whatever gang it belongs to."""
    return f"{job.name}-{rank}"


def worker_pod_name(job: DistributedTraining, rank: int, gang_generation: int = 0) -> str:
    """`<name>-<rank>`; a job in a Kueue queue's restarted gangs add their generation: Kueue lets a pod of its
    group go (its finalizer) only once a pod of another name replaces it."""
    if gang_generation and queueing.queue_name(job) is not None:
        return f"{job.name}-{rank}-g{gang_generation}"
    return worker_hostname(job, rank)


def engine_job_name(job: DistributedTraining) -> str:
    return f"{job.name}-engine"


def pod_group_name(job: DistributedTraining) -> str:
    return job.name


def standby_pod_name(job: DistributedTraining, rank: int) -> str:
    return f"{job.name}-standby-{rank}"


def master_address(job: DistributedTraining) -> str:
    """Rank 0's DNS name: pod hostname + subdomain through the headless Service."""
    return f"{worker_hostname(job, 0)}.{service_name(job)}.{job.namespace}.svc"


def job_labels(job: DistributedTraining, role: str) -> dict[str, str]:
    return {
        contract.LABEL_JOB_NAME: job.name,
        contract.LABEL_ROLE: role,
        "app.kubernetes.io/name": "dtrain",
        "app.kubernetes.io/managed-by": "dtrain-operator",
    }


def worker_selector(job: DistributedTraining) -> dict[str, str]:
    return {contract.LABEL_JOB_NAME: job.name, contract.LABEL_ROLE: contract.ROLE_WORKER}


def worker_labels(job: DistributedTraining, rank: int, gang_generation: int) -> dict[str, str]:
    labels = job_labels(job, contract.ROLE_WORKER)
    labels[contract.LABEL_NODE_RANK] = str(rank)
    labels[contract.LABEL_GANG_GENERATION] = str(gang_generation)
    if job.spec.scheduling.gang_provider == "scheduler-plugins":
        labels[COSCHEDULING_GROUP_LABEL] = pod_group_name(job)
    labels.update(queueing.worker_labels(job))
    return labels


def child_metadata(job: DistributedTraining, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": job.namespace, "labels": labels}
