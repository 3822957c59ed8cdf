"""Pure renderers: a DistributedTraining in, the Kubernetes objects it stands for out.

No I/O, no clock, no globals. The operator creates what these return (adding owner
references in one place, controller.children.adopt); `dtrain run` runs the same command with the
same launch environment (core.launch_env) as local processes. Here: the worker pods (with the trainer's files) and
the Service, and every child in creation order (render_children); the engine Job, the PodGroup, the
NetworkPolicy and the standby pods have modules of their own, the parts every pod shares are in pod_parts.py.
"""

from __future__ import annotations

from typing import Any

import yaml

from dtrain_operator.api import (
    DistributedTraining,
    TrainerConfig,
    contract,
)
from dtrain_operator.core import queueing
from dtrain_operator.core.child_names import (
    VOLCANO_GROUP_ANNOTATION,
    child_metadata,
    job_labels,
    pod_group_name,
    service_name,
    worker_hostname,
    worker_labels,
    worker_pod_name,
    worker_selector,
)
from dtrain_operator.core.engine_job import render_engine_job
from dtrain_operator.core.launch_env import ReportEndpoint, launch_env, pod_site
from dtrain_operator.core.pod_groups import render_pod_group
from dtrain_operator.core.pod_parts import CONTAINER_SECURITY, POD_SECURITY, container_resources, scheduling_fields
from dtrain_operator.core.storage_volumes import (
    credentials_env,
    storage_mounts,
    storage_volumes,
)

TRAINER_CONTAINER = "trainer"
RENDEZVOUS_PORT_NAME = "rendezvous"
# Worker command: torchrun (through dtrain's launcher, which passes on the failing worker's
# own exit code) takes its flags from the PET_* variables and runs the trainer module.
TRAINER_COMMAND = ["python", "-m", "dtrain_trainer.launch", "-m", "dtrain_trainer"]
# In a pod, dtrain's supervisor runs that command and runs it again when the operator restarts the gang
# in place (api.launches); without the operator's address it becomes the launcher itself.
POD_COMMAND = ["python", "-m", "dtrain_trainer.supervisor", "-m", "dtrain_trainer"]


def _var(name: str, value: Any) -> dict[str, Any]:
    return {"name": name, "value": str(value)}


def worker_env(
    job: DistributedTraining,
    rank: int,
    report: ReportEndpoint | None = None,
    gang_generation: int = 0,
    gang_nodes: int | None = None,
) -> list[dict[str, Any]]:
    """The trainer container's environment: its launch environment, the node it runs on (downward API),
    the object store's credentials, then the user's. The gang generation is the supervisor's first launch."""
    site = pod_site(job, report)
    return [
        *(_var(name, value) for name, value in launch_env(job, rank, site, gang_generation, gang_nodes).items()),
        _var(contract.ENV_GANG_GENERATION, gang_generation),
        {"name": contract.ENV_NODE_NAME, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}},
        *credentials_env(job),
        *(var.to_wire() for var in job.spec.env),
    ]


def render_service(job: DistributedTraining) -> dict[str, Any]:
    """Headless Service that gives every worker pod a DNS name, ready or not."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(job, service_name(job), job_labels(job, contract.ROLE_WORKER)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": worker_selector(job),
            "ports": [{"name": RENDEZVOUS_PORT_NAME, "port": job.spec.master_port, "protocol": "TCP"}],
        },
    }


def trainer_config(job: DistributedTraining) -> dict[str, Any]:
    """The trainer's config (wire format), as mounted at DTRAIN_CONFIG."""
    return TrainerConfig.from_job(job).to_wire()


# libyaml's emitter when present: the pure-Python one costs milliseconds per pod.
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def trainer_files(job: DistributedTraining, report: ReportEndpoint | None = None) -> dict[str, str]:
    """The files of contract.CONFIG_MOUNT_DIR: the trainer's config and, with a report endpoint, the CA rank 0
    checks the operator's certificate with (the one of the pod's creation: a gang after a new CA has it)."""
    files = {contract.CONFIG_FILE_NAME: yaml.dump(trainer_config(job), Dumper=_YAML_DUMPER, sort_keys=False)}
    if report is not None:
        files[contract.OPERATOR_CA_FILE_NAME] = report.ca_pem
    return files


def _trainer_files_volume(files: dict[str, str]) -> dict[str, Any]:
    """The pod's own annotations (contract.TRAINER_FILE_ANNOTATIONS) as files, through the downward API."""
    items = [{"path": name, "fieldRef": {"fieldPath": f"metadata.annotations['{contract.TRAINER_FILE_ANNOTATIONS[name]}']"}}
             for name in files]
    return {"name": contract.CONFIG_VOLUME, "downwardAPI": {"items": items}}


def _operator_token_volume() -> dict[str, Any]:
    """A service-account token for the operator's audience only, bound to the pod (the kubelet refreshes it)."""
    token = {
        "audience": contract.OPERATOR_TOKEN_AUDIENCE,
        "expirationSeconds": contract.OPERATOR_TOKEN_SECONDS,
        "path": contract.OPERATOR_TOKEN_FILE_NAME,
    }
    return {"name": contract.OPERATOR_TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}}


def _trainer_container(
    job: DistributedTraining, rank: int, report: ReportEndpoint | None, gang_generation: int, gang_nodes: int | None
) -> dict[str, Any]:
    """The trainer container; with `report`, its token for the operator mounted."""
    spec = job.spec
    return {
        "name": TRAINER_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(POD_COMMAND),
        "env": worker_env(job, rank, report, gang_generation, gang_nodes),
        "ports": [{"name": RENDEZVOUS_PORT_NAME, "containerPort": spec.master_port, "protocol": "TCP"}],
        "volumeMounts": [
            {"name": contract.CONFIG_VOLUME, "mountPath": contract.CONFIG_MOUNT_DIR, "readOnly": True},
            {"name": contract.SHM_VOLUME, "mountPath": contract.SHM_MOUNT_PATH},
            *storage_mounts(job),
            *spec.volume_mounts,
            *([{"name": contract.OPERATOR_TOKEN_VOLUME, "mountPath": contract.OPERATOR_TOKEN_DIR, "readOnly": True}]
              if report is not None else []),
        ],
        "securityContext": dict(CONTAINER_SECURITY),
        "terminationMessagePath": contract.TERMINATION_LOG_PATH,
        # The end of a failing trainer's log becomes the pod's message, and so the job's condition.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def render_worker_pod(
    job: DistributedTraining,
    rank: int,
    gang_generation: int = 0,
    report: ReportEndpoint | None = None,
    gang_nodes: int | None = None,
) -> dict[str, Any]:
    """Worker pod `<name>-<rank>`: torchrun on the trainer, the operator owning restarts. `gang_nodes`: an
    elastic gang's size now (default spec.nodes).

    No pod holds a token for the API server; each holds one for the operator's report endpoint, where rank 0
    sends its records and every pod's supervisor reports its launch (api.launches)."""
    reports = report is not None
    spec = job.spec
    gpus = spec.devices_per_node if spec.accelerator == "gpu" else 0
    metadata = child_metadata(job, worker_pod_name(job, rank, gang_generation), worker_labels(job, rank, gang_generation))
    files = trainer_files(job, report)
    annotations = {contract.TRAINER_FILE_ANNOTATIONS[name]: text for name, text in files.items()}
    annotations.update(queueing.worker_annotations(job))
    if spec.scheduling.gang_provider == "volcano":
        annotations[VOLCANO_GROUP_ANNOTATION] = pod_group_name(job)
    metadata["annotations"] = annotations
    container = _trainer_container(job, rank, report if reports else None, gang_generation, gang_nodes)
    resources = container_resources(spec.resources, gpus)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "hostname": worker_hostname(job, rank),
        "subdomain": service_name(job),
        "restartPolicy": "Never",
        # SIGTERM stops training at a step boundary and rank 0 saves a checkpoint: give it the time.
        "terminationGracePeriodSeconds": spec.termination_grace_period_seconds,
        "serviceAccountName": spec.service_account_name,
        # The trainer never calls the Kubernetes API: it reports to the operator.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": dict(POD_SECURITY),
        "containers": [container],
        "volumes": [
            _trainer_files_volume(files),
            # NCCL and DataLoader workers share memory through /dev/shm; the default 64 MiB is far too small.
            {"name": contract.SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
            *storage_volumes(job),
            *spec.volumes,
            *([_operator_token_volume()] if reports else []),
        ],
        **scheduling_fields(job, gang_generation),
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [ref.to_wire() for ref in spec.image_pull_secrets]
    gates = queueing.worker_scheduling_gates(job)
    if gates:
        pod_spec["schedulingGates"] = gates
    if spec.scheduling.gang_provider == "kubernetes":
        # The workers' gang only: the engine Job's pod comes after it and is scheduled alone.
        pod_spec["schedulingGroup"] = {"podGroupName": pod_group_name(job)}
    if spec.host_network:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def render_workers(
    job: DistributedTraining, gang_generation: int = 0, report: ReportEndpoint | None = None
) -> list[dict[str, Any]]:
    return [render_worker_pod(job, rank, gang_generation, report) for rank in range(job.spec.nodes)]


def render_children(
    job: DistributedTraining, gang_generation: int = 0, report: ReportEndpoint | None = None
) -> list[dict[str, Any]]:
    """Every object the job can have, in creation order (the engine Job last)."""
    children = [render_service(job)]
    pod_group = render_pod_group(job)
    if pod_group is not None:
        children.append(pod_group)
    children.extend(render_workers(job, gang_generation, report))
    if job.spec.engine.enabled:
        children.append(render_engine_job(job))
    return children
