"""A worker's launch environment, the one source of it for a pod (core.render) and for `dtrain run` (local/):
torchrun's PET_* variables, dtrain's contract, NCCL's and the object store's."""

from __future__ import annotations

from dataclasses import dataclass

from dtrain_operator.api import DistributedTraining, contract, job_dirs, storage
from dtrain_operator.core.child_names import master_address, worker_pod_name
from dtrain_operator.core.storage_volumes import object_store_env


@dataclass(frozen=True)
class ReportEndpoint:
    """Where rank 0 sends its records: the operator's report Service, and the CA that vouches for it."""

    url: str
    """https://<service>.<namespace>.svc:<port>, every operator replica behind it."""
    ca_pem: str


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
