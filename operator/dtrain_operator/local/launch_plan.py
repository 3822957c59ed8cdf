"""What `dtrain run` starts, decided by the operator's own rules (pure).

Each worker pod the operator would create becomes one local "node": the trainer
container's command run from this interpreter, with the launch environment the
operator renders into the pod (`launch_env.launch_env`) for this machine's site, the
user's spec.env resolved here (the downward API answered for one machine, Secrets
and ConfigMaps skipped with a warning), and the pod's paths (checkpoints,
artifacts, config) moved into the workdir. Nothing here starts a process or
touches the disk.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dtrain_operator.api import DistributedTraining, contract, job_dirs, storage
from dtrain_operator.core import child_names, engine_job, launch_env, policy, render

LOCAL_MASTER_ADDR = "127.0.0.1"
# A person watches the bar: report more often than the operator's status patches need.
LOCAL_PROGRESS_INTERVAL_SECONDS = 2.0

# Commands of the rendered containers, run from this interpreter so that the
# environment `dtrain` was installed in is the one that trains.
_LOCAL_PROGRAMS = {
    "python": [sys.executable],
    "dtrain": [sys.executable, "-m", "dtrain_operator.cli"],
}
# The downward API's answers when the "pod" is a process on this machine.
# The Kubernetes node a `dtrain run` node is on: this machine.
LOCAL_NODE_NAME = socket.gethostname()
_LOCAL_FIELD_REFS = {
    "metadata.namespace": lambda job, rank: job.namespace,
    "metadata.name": lambda job, rank: child_names.worker_pod_name(job, rank),
    "spec.serviceAccountName": lambda job, rank: job.spec.service_account_name,
    "spec.nodeName": lambda job, rank: LOCAL_NODE_NAME,
    "status.podIP": lambda job, rank: LOCAL_MASTER_ADDR,
    "status.hostIP": lambda job, rank: LOCAL_MASTER_ADDR,
}


@dataclass(frozen=True)
class Workdir:
    """Where one local run keeps everything it writes."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / contract.CONFIG_FILE_NAME

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def progress(self) -> Path:
        return self.root / "progress.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def engine_log(self) -> Path:
        return self.logs / "engine.log"

    @property
    def engine_termination_log(self) -> Path:
        return self.logs / "engine.termination.json"

    @property
    def engine_report(self) -> Path:
        return self.artifacts / contract.ENGINE_REPORT_FILE_NAME

    @property
    def onnx(self) -> Path:
        return self.artifacts / contract.ONNX_FILE_NAME

    @property
    def artifacts_json(self) -> Path:
        return self.artifacts / contract.ARTIFACTS_FILE_NAME

    def node_log(self, rank: int) -> Path:
        return self.logs / f"node-{rank}.log"

    def termination_log(self, rank: int) -> Path:
        return self.logs / f"node-{rank}.termination.json"

    def owned_entries(self) -> list[Path]:
        """What a fresh run clears: only the names `dtrain run` itself writes."""
        return [self.config, self.checkpoints, self.artifacts, self.logs, self.progress, self.summary]


def default_workdir(job: DistributedTraining, cwd: Path) -> Path:
    return cwd / "dtrain-runs" / job.name


@dataclass(frozen=True)
class Overrides:
    """Command-line changes to the job for this machine."""

    nodes: int | None = None
    devices_per_node: int | None = None


@dataclass(frozen=True)
class LocalJob:
    """The job as it runs here, and what was changed to make it run here."""

    job: DistributedTraining
    warnings: list[str] = field(default_factory=list)
    # Per node, the CUDA devices it may use (empty lists on the CPU).
    cuda_devices: list[list[str]] = field(default_factory=list)


class PlanError(ValueError):
    """The job cannot run on this machine as asked; the message says what to change."""


def localize(
    job: DistributedTraining,
    overrides: Overrides,
    workdir: Workdir,
    cuda_visible: Sequence[str],
) -> LocalJob:
    """The job with overrides applied, accelerator settled for this machine and paths in the workdir.

    `cuda_visible` is the list of CUDA devices this machine offers (empty without CUDA).
    """
    spec = job.spec
    nodes = overrides.nodes if overrides.nodes is not None else spec.nodes
    devices = overrides.devices_per_node if overrides.devices_per_node is not None else spec.devices_per_node
    if nodes < 1:
        raise PlanError(f"--nodes must be at least 1 (got {nodes})")
    if devices < 1:
        raise PlanError(f"--devices-per-node must be at least 1 (got {devices})")
    warnings: list[str] = []
    accelerator = spec.accelerator
    cuda_devices: list[list[str]] = [[] for _ in range(nodes)]
    if accelerator == "gpu":
        if not cuda_visible:
            accelerator = "cpu"
            warning = "accelerator is gpu but this machine has no CUDA device: training on the CPU (gloo)"
            if spec.trainer.precision in ("16-mixed", "16-true"):
                warning += f"; precision {spec.trainer.precision} falls back to 32-true in the trainer"
            warnings.append(warning)
        else:
            cuda_devices = assign_gpus(nodes, devices, cuda_visible)
    for mount in spec.volume_mounts:
        warnings.append(
            f"volumeMount {mount.get('name')} at {mount.get('mountPath')} is not mounted outside a cluster: "
            "the trainer reads that path on this machine as it is"
        )
    # Object storage stays where the spec puts it (the nodes reach the bucket from here too); a path moves into the workdir.
    checkpoints = job_dirs.checkpoint_dir(spec, job.namespace, job.name)
    artifacts = job_dirs.artifacts_dir(spec, job.namespace, job.name)
    new_spec = spec.model_copy(
        update={
            "nodes": nodes,
            "devices_per_node": devices,
            "accelerator": accelerator,
            "checkpoint": spec.checkpoint.model_copy(
                update={"dir": checkpoints if storage.is_object_url(checkpoints) else str(workdir.checkpoints)}
            ),
            "artifacts": spec.artifacts.model_copy(
                update={"dir": artifacts if storage.is_object_url(artifacts) else str(workdir.artifacts)}
            ),
        }
    )
    return LocalJob(job.model_copy(update={"spec": new_spec}), warnings, cuda_devices)


def assign_gpus(nodes: int, devices_per_node: int, visible: Sequence[str]) -> list[list[str]]:
    """Split the visible GPUs between the local nodes: each gets its own, as each pod would."""
    needed = nodes * devices_per_node
    if needed > len(visible):
        raise PlanError(
            f"the job needs {needed} GPU(s) ({nodes} node(s) x {devices_per_node}) but this machine has "
            f"{len(visible)}; pass --nodes and --devices-per-node that fit, or set accelerator: cpu"
        )
    return [list(visible[r * devices_per_node : (r + 1) * devices_per_node]) for r in range(nodes)]


def local_command(command: Sequence[str]) -> list[str]:
    """A rendered container command as a local argv (`torchrun`, `dtrain` run from this interpreter)."""
    program, *rest = command
    return [*_LOCAL_PROGRAMS.get(program, [program]), *rest]


def user_env(job: DistributedTraining, rank: int) -> tuple[dict[str, str], list[str]]:
    """spec.env as plain variables for node `rank`, and a warning per variable that cannot be set here."""
    values: dict[str, str] = {}
    warnings: list[str] = []
    for var in job.spec.env:
        if var.value is not None:
            values[var.name] = var.value
            continue
        source = var.to_wire().get("valueFrom") or {}
        field_path = (source.get("fieldRef") or {}).get("fieldPath")
        if field_path in _LOCAL_FIELD_REFS:
            values[var.name] = _LOCAL_FIELD_REFS[field_path](job, rank)
            continue
        kind = next(iter(source), "valueFrom")
        warnings.append(f"env {var.name}: {kind} cannot be resolved outside a cluster; it is not set locally")
    return values, warnings


def omp_threads(cores: int, processes: int) -> int:
    """OpenMP threads per training process, so that the processes together do not oversubscribe the cores."""
    return max(1, cores // max(1, processes))


@dataclass(frozen=True)
class NodeLaunch:
    """One local node: the argv and the full environment of its torchrun."""

    rank: int
    argv: list[str]
    env: dict[str, str]


def local_site(workdir: Workdir, master_port: int, rank: int) -> launch_env.LaunchSite:
    """Where node `rank` of a local run finds rank 0, its config and its progress file: all on this machine."""
    return launch_env.LaunchSite(
        master_addr=LOCAL_MASTER_ADDR,
        master_port=master_port,
        config_path=str(workdir.config),
        progress_sink=f"{contract.PROGRESS_SINK_JSONL_PREFIX}{workdir.progress}",
        node_name=LOCAL_NODE_NAME,
        termination_log=str(workdir.termination_log(rank)),
        progress_interval_seconds=LOCAL_PROGRESS_INTERVAL_SECONDS,
    )


def node_launches(
    local: LocalJob,
    workdir: Workdir,
    master_port: int,
    base_env: Mapping[str, str],
    cores: int,
    nodes: int | None = None,
) -> tuple[list[NodeLaunch], list[str]]:
    """Every node's launch: the worker pod's command and launch environment on this machine, and the
    warnings about spec.env (once each). `nodes`: an elastic gang's size now (default spec.nodes)."""
    job = local.job
    nodes = nodes or job.spec.nodes
    processes = nodes * job.spec.devices_per_node
    # What the runner inherited from a surrounding torchrun or dtrain must not leak into the nodes.
    inherited = {k: v for k, v in base_env.items() if not contract.is_reserved_env_name(k)}
    launches: list[NodeLaunch] = []
    warnings: list[str] = []
    for rank in range(nodes):
        values, env_warnings = user_env(job, rank)
        warnings.extend(w for w in env_warnings if w not in warnings)
        # OMP_NUM_THREADS: the job's env, else the caller's, else the cores shared between the processes.
        env = {
            "OMP_NUM_THREADS": str(omp_threads(cores, processes)),
            **inherited,
            **launch_env.launch_env(job, rank, local_site(workdir, master_port, rank), gang_nodes=nodes),
            **values,
            # Logs reach the node's log file as they are written, so a failure's last lines are there.
            "PYTHONUNBUFFERED": "1",
        }
        if rank < len(local.cuda_devices) and local.cuda_devices[rank]:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(local.cuda_devices[rank])
        launches.append(NodeLaunch(rank, local_command(render.TRAINER_COMMAND), env))
    return launches, warnings


def engine_argv(job: DistributedTraining, workdir: Workdir) -> list[str]:
    """The engine Job's command, run here: TensorRT where it can run, else ONNX Runtime checks and timings.

    The PyTorch model behind the eager baseline is named outright: the final checkpoint
    and the trainer config that the run wrote.
    """
    command = local_command(engine_job.engine_command(job))
    fallback = [] if "--fallback" in command else ["--fallback", "onnxruntime"]
    # On object storage, artifacts.json names the checkpoint the model was exported from.
    checkpoint = (
        [] if storage.is_object_url(job.spec.checkpoint.dir)
        else ["--pytorch-checkpoint", str(workdir.checkpoints / contract.LAST_CHECKPOINT_FILE_NAME)]
    )
    return [*command, *fallback, *checkpoint, "--model-config", str(workdir.config)]


def worker_exit_code(returncode: int) -> int:
    """The exit code a node's failure counts as, in the pod's convention (128 + n when killed by signal n).

    The node's launcher (dtrain_trainer.launch) already exits with the failing worker's
    own code; a launcher killed by signal n is -n to Popen and 128 + n in a pod.
    """
    return policy.SIGNAL_EXIT_CODE_BASE - returncode if returncode < 0 else returncode


# A worker pod's terminationMessagePolicy, FallbackToLogsOnError: with no termination message written, a container
# that failed has the end of its log as its message, at most this many lines and bytes.
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048


def termination_message(written: str, log: str) -> str:
    """A failed node's termination message, as its pod's would be: what its trainer wrote to the termination log
    (at most 4 KiB), else the end of its log (what failure rules' onTerminationMessage is matched against)."""
    if written.strip():
        return written.encode()[: contract.TERMINATION_MESSAGE_MAX_BYTES].decode(errors="ignore")
    tail = "\n".join(log.splitlines()[-FALLBACK_LOG_LINES:])
    return tail.encode()[-FALLBACK_LOG_BYTES:].decode(errors="ignore")


def failure_excerpt(log: str, lines: int) -> str:
    """The last `lines` of a failed node's log: the worker's error and the launcher's failure report."""
    return "\n".join(log.splitlines()[-lines:])
