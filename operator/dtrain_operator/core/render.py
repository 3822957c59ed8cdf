"""Pure renderers: a DistributedTraining in, the Kubernetes objects it stands for out.

No I/O, no clock, no globals. The operator creates what these return (adding owner
references in one place, controller.children.adopt); `dtrain run` runs the same command with the
same launch environment (launch_env) as local processes. This is where a worker's environment is decided.
"""

# layout: every object a job stands for in one module (a little over 400 lines): the pods, the engine Job,
# the Service and the ConfigMap share the pod-spec parts, which would otherwise cross modules as private names.

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from dtrain_operator.api import (
    DistributedTraining,
    Resources,
    TrainerConfig,
    contract,
    engine_options,
    job_dirs,
    storage,
)
from dtrain_operator.core import queueing
from dtrain_operator.core.storage_volumes import (
    credentials_env,
    object_store_env,
    storage_env,
    storage_mounts,
    storage_volumes,
)

GPU_RESOURCE = "nvidia.com/gpu"
TRAINER_CONTAINER = "trainer"
ENGINE_CONTAINER = "engine"
RENDEZVOUS_PORT_NAME = "rendezvous"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
NATIVE_POD_GROUP_API = "scheduling.k8s.io/v1alpha2"  # Kubernetes' own gang scheduling (1.36 alpha)
# Worker command: torchrun (through dtrain's launcher, which passes on the failing worker's
# own exit code) takes its flags from the PET_* variables and runs the trainer module.
TRAINER_COMMAND = ["python", "-m", "dtrain_trainer.launch", "-m", "dtrain_trainer"]
# In a pod, dtrain's supervisor runs that command and runs it again when the operator restarts the gang
# in place (api.launches); without the operator's address it becomes the launcher itself.
POD_COMMAND = ["python", "-m", "dtrain_trainer.supervisor", "-m", "dtrain_trainer"]


@dataclass(frozen=True)
class ReportEndpoint:
    """Where rank 0 sends its records: the operator's report Service, and the CA that vouches for it."""

    url: str
    """https://<service>.<namespace>.svc:<port>, every operator replica behind it."""
    ca_pem: str


# --- Names ---------------------------------------------------------------------------


def service_name(job: DistributedTraining) -> str:
    return job.name


def config_map_name(job: DistributedTraining) -> str:
    return f"{job.name}-config"


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


def master_address(job: DistributedTraining) -> str:
    """Rank 0's DNS name: pod hostname + subdomain through the headless Service."""
    return f"{worker_hostname(job, 0)}.{service_name(job)}.{job.namespace}.svc"


# --- Labels ----------------------------------------------------------------------------


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


def _metadata(job: DistributedTraining, name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": job.namespace, "labels": labels}


# --- Environment -------------------------------------------------------------------------


def _var(name: str, value: Any) -> dict[str, Any]:
    return {"name": name, "value": str(value)}


def shutdown_timeout_seconds(job: DistributedTraining) -> int:
    """torchrun's wait for its workers after SIGTERM: the pod's grace period, less time for torchrun to exit."""
    grace = job.spec.termination_grace_period_seconds
    return max(1, grace - min(contract.SHUTDOWN_MARGIN_SECONDS, grace // 3))


@dataclass(frozen=True)
class LaunchSite:
    """What differs between a worker pod and a `dtrain run` node: where rank 0, the config and the records are."""

    master_addr: str
    master_port: int
    config_path: str
    progress_sink: str
    node_name: str | None = None
    """The machine's name; None in a pod, where the downward API gives spec.nodeName."""
    operator_url: str | None = None
    termination_log: str | None = None
    progress_interval_seconds: float | None = None


def pod_site(job: DistributedTraining, report: ReportEndpoint | None = None) -> LaunchSite:
    """A worker pod's site. With a report endpoint, rank 0 sends its records to the operator; without
    one they go to the log."""
    return LaunchSite(
        master_addr=master_address(job),
        master_port=job.spec.master_port,
        config_path=contract.CONFIG_PATH,
        progress_sink=contract.PROGRESS_SINK_OPERATOR if report is not None else contract.PROGRESS_SINK_STDOUT,
        operator_url=report.url if report is not None else None,
    )


def launch_env(
    job: DistributedTraining, rank: int, site: LaunchSite, gang_generation: int = 0, gang_nodes: int | None = None
) -> dict[str, str]:
    """A worker's launch environment, the one source of it for a pod and for `dtrain run`: torchrun's PET_*
    (the only route the gang's shape takes to the trainer: `gang_nodes`, an elastic gang's size now, or
    spec.nodes), dtrain's contract, the NCCL_* variables of spec.nccl and the object store's endpoint. The
    user's spec.env comes after it in each."""
    spec = job.spec
    env = {
        contract.ENV_NNODES: str(gang_nodes or spec.nodes),
        contract.ENV_NPROC_PER_NODE: str(spec.devices_per_node),
        contract.ENV_NODE_RANK: str(rank),
        contract.ENV_MASTER_ADDR: site.master_addr,
        contract.ENV_MASTER_PORT: str(site.master_port),
        contract.ENV_SHUTDOWN_TIMEOUT: str(shutdown_timeout_seconds(job)),
        contract.ENV_CONFIG: site.config_path,
        contract.ENV_JOB_NAME: job.name,
        contract.ENV_JOB_NAMESPACE: job.namespace,
        contract.ENV_POD_NAME: worker_pod_name(job, rank, gang_generation),
        contract.ENV_PROGRESS_SINK: site.progress_sink,
    }
    optional = {
        contract.ENV_NODE_NAME: site.node_name,
        contract.ENV_OPERATOR_URL: site.operator_url,
        contract.ENV_TERMINATION_LOG: site.termination_log,
        contract.ENV_PROGRESS_INTERVAL: site.progress_interval_seconds,
    }
    env.update({name: str(value) for name, value in optional.items() if value is not None})
    env.update(flight_recorder_env(job))
    env.update(spec.nccl.to_env())
    env.update(object_store_env(job))
    return env


def flight_recorder_env(job: DistributedTraining) -> dict[str, str]:
    """On GPUs, PyTorch's flight recorder for NCCL: each rank keeps its last collectives, dumps them into a hang's
    directory when rank 0 collects the stacks (dtrain_trainer.hang_watch), and NCCL dumps them itself when a
    collective times out, under artifacts.dir/hangs where that is a path. spec.nccl.env and spec.env override."""
    if job.spec.accelerator != "gpu":
        return {}
    env = {
        contract.ENV_FLIGHT_RECORDER_BUFFER: str(contract.FLIGHT_RECORDER_ENTRIES),
        contract.ENV_NCCL_DUMP_ON_TIMEOUT: "1",
    }
    artifacts = job_dirs.artifacts_dir(job.spec, job.namespace, job.name)
    if not storage.is_object_url(artifacts):
        hangs = f"{artifacts.rstrip('/')}/{contract.HANGS_DIR_NAME}"
        env[contract.ENV_FLIGHT_RECORDER_DUMP_FILE] = f"{hangs}/{contract.NCCL_TIMEOUT_DUMP_PREFIX}"
    return env


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
        {"name": contract.ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        *credentials_env(job),
        *(var.to_wire() for var in job.spec.env),
    ]


# --- Objects ---------------------------------------------------------------------------------


def render_service(job: DistributedTraining) -> dict[str, Any]:
    """Headless Service that gives every worker pod a DNS name, ready or not."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, service_name(job), job_labels(job, contract.ROLE_WORKER)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": worker_selector(job),
            "ports": [{"name": RENDEZVOUS_PORT_NAME, "port": job.spec.master_port, "protocol": "TCP"}],
        },
    }


def render_network_policy(job: DistributedTraining) -> dict[str, Any]:
    """Ingress to the job's pods only from the job's own pods (`dtrain operator --network-policy`):
    torchrun's rendezvous port, and the ports NCCL and gloo open between ranks, admit no one else."""
    own = {contract.LABEL_JOB_NAME: job.name}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(job, job.name, job_labels(job, contract.ROLE_WORKER)),
        "spec": {
            "podSelector": {"matchLabels": own},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": own}}]}],
        },
    }


def trainer_config(job: DistributedTraining) -> dict[str, Any]:
    """The trainer's config (wire format), as mounted at DTRAIN_CONFIG."""
    return TrainerConfig.from_job(job).to_wire()


# libyaml's emitter when present: the pure-Python one costs milliseconds per ConfigMap.
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def render_config_map(job: DistributedTraining, report: ReportEndpoint | None = None) -> dict[str, Any]:
    """The trainer's config and, with a report endpoint, the CA rank 0 checks the operator's certificate with."""
    data = {contract.CONFIG_FILE_NAME: yaml.dump(trainer_config(job), Dumper=_YAML_DUMPER, sort_keys=False)}
    if report is not None:
        data[contract.OPERATOR_CA_FILE_NAME] = report.ca_pem
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, config_map_name(job), job_labels(job, contract.ROLE_WORKER)),
        "data": data,
    }


def _operator_token_volume() -> dict[str, Any]:
    """A service-account token for the operator's audience only, bound to the pod (the kubelet refreshes it)."""
    token = {
        "audience": contract.OPERATOR_TOKEN_AUDIENCE,
        "expirationSeconds": contract.OPERATOR_TOKEN_SECONDS,
        "path": contract.OPERATOR_TOKEN_FILE_NAME,
    }
    return {"name": contract.OPERATOR_TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": token}]}}


def _resources(resources: Resources | None, gpus: int) -> dict[str, Any]:
    out = resources.to_wire() if resources is not None else {}
    if gpus:
        # GPUs are requested through limits; Kubernetes copies them to requests.
        out.setdefault("limits", {})[GPU_RESOURCE] = gpus
        out.get("requests", {}).pop(GPU_RESOURCE, None)
    return {k: v for k, v in out.items() if v}


_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "capabilities": {"drop": ["ALL"]},
}
_POD_SECURITY = {
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


def _scheduling_fields(job: DistributedTraining, gang_generation: int | None = None) -> dict[str, Any]:
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
        "securityContext": dict(_CONTAINER_SECURITY),
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
    metadata = _metadata(job, worker_pod_name(job, rank, gang_generation), worker_labels(job, rank, gang_generation))
    annotations = queueing.worker_annotations(job)
    if spec.scheduling.gang_provider == "volcano":
        annotations[VOLCANO_GROUP_ANNOTATION] = pod_group_name(job)
    if annotations:
        metadata["annotations"] = annotations
    container = _trainer_container(job, rank, report if reports else None, gang_generation, gang_nodes)
    resources = _resources(spec.resources, gpus)
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
        "securityContext": dict(_POD_SECURITY),
        "containers": [container],
        "volumes": [
            {"name": contract.CONFIG_VOLUME, "configMap": {"name": config_map_name(job)}},
            # NCCL and DataLoader workers share memory through /dev/shm; the default 64 MiB is far too small.
            {"name": contract.SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
            *storage_volumes(job),
            *spec.volumes,
            *([_operator_token_volume()] if reports else []),
        ],
        **_scheduling_fields(job, gang_generation),
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


# What a standby pod runs: nothing, until it is deleted (python is in every trainer image).
STANDBY_COMMAND = ["python", "-c", "import signal; signal.pause()"]
STANDBY_GRACE_SECONDS = 1


def standby_pod_name(job: DistributedTraining, rank: int) -> str:
    return f"{job.name}-standby-{rank}"


def render_standby_pod(job: DistributedTraining, rank: int) -> dict[str, Any]:
    """Standby pod `<name>-standby-<rank>`: holds the place of node `rank`, which an elastic gang lacks now
    (core.elastic). Placed as rank's worker would be (image, resources, volumes, scheduling); it runs nothing,
    is no member of the Service, and holds no token."""
    pod = render_worker_pod(job, rank)
    pod["metadata"]["name"] = standby_pod_name(job, rank)
    pod["metadata"]["labels"][contract.LABEL_ROLE] = contract.ROLE_STANDBY
    pod_spec = pod["spec"]
    for name in ("hostname", "subdomain"):
        pod_spec.pop(name, None)
    pod_spec["terminationGracePeriodSeconds"] = STANDBY_GRACE_SECONDS
    container = pod_spec["containers"][0]
    container.update(command=list(STANDBY_COMMAND), env=[])
    container.pop("ports", None)
    return pod


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
    resources = _resources(engine.resources, 0) if engine.resources is not None else {"limits": {GPU_RESOURCE: 1}}
    labels = job_labels(job, contract.ROLE_ENGINE)
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER,
        "image": engine.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": engine_command(job),
        "resources": resources,
        "volumeMounts": [*storage_mounts(job), *spec.volume_mounts],
        "securityContext": dict(_CONTAINER_SECURITY),
        "terminationMessagePath": contract.TERMINATION_LOG_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if storage_env(job):
        container["env"] = storage_env(job)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # The engine build needs no API access.
        "automountServiceAccountToken": False,
        "securityContext": dict(_POD_SECURITY),
        "containers": [container],
        "volumes": [*storage_volumes(job), *spec.volumes],
        **{k: v for k, v in _scheduling_fields(job).items() if k != "schedulerName"},
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [ref.to_wire() for ref in spec.image_pull_secrets]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(job, engine_job_name(job), labels),
        "spec": {
            "backoffLimit": engine.backoff_limit,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def render_pod_group(job: DistributedTraining) -> dict[str, Any] | None:
    """A PodGroup for gang scheduling (Kubernetes', Volcano's or scheduler-plugins'), or None when not asked for."""
    gang, provider = job.spec.scheduling.gang, job.spec.scheduling.gang_provider
    if provider is None:
        return None
    min_member = gang.min_available if gang.min_available is not None else job.spec.nodes
    metadata = _metadata(job, pod_group_name(job), job_labels(job, contract.ROLE_WORKER))
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


def render_workers(
    job: DistributedTraining, gang_generation: int = 0, report: ReportEndpoint | None = None
) -> list[dict[str, Any]]:
    return [render_worker_pod(job, rank, gang_generation, report) for rank in range(job.spec.nodes)]


def render_children(
    job: DistributedTraining, gang_generation: int = 0, report: ReportEndpoint | None = None
) -> list[dict[str, Any]]:
    """Every object the job can have, in creation order (the engine Job last)."""
    children = [render_service(job), render_config_map(job, report)]
    pod_group = render_pod_group(job)
    if pod_group is not None:
        children.append(pod_group)
    children.extend(render_workers(job, gang_generation, report))
    if job.spec.engine.enabled:
        children.append(render_engine_job(job))
    return children
