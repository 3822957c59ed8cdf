"""The contract between the operator (and `dtrain run`) and the trainer.

Every environment variable, label, annotation, path and port that one side sets and
the other reads is named here once and imported by both sides. This module imports
nothing beyond the standard library so that the trainer image can use it without
the operator's dependencies.
"""

from __future__ import annotations

from typing import Final

# --- The API ------------------------------------------------------------------
# Literals (Final), so that their types are the ones the model's apiVersion and kind fields accept.
API_VERSION: Final = "dtrain.dev/v1alpha1"
KIND: Final = "DistributedTraining"
GROUP, VERSION = API_VERSION.split("/")
PLURAL = "distributedtrainings"
SINGULAR = "distributedtraining"
SHORT_NAME = "dtr"

# Where each kind dtrain touches lives in the API: (path prefix, plural).
RESOURCES: dict[tuple[str, str], tuple[str, str]] = {
    ("v1", "Pod"): ("/api/v1", "pods"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
    ("v1", "Secret"): ("/api/v1", "secrets"),
    ("v1", "Event"): ("/api/v1", "events"),
    ("batch/v1", "Job"): ("/apis/batch/v1", "jobs"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("/apis/networking.k8s.io/v1", "networkpolicies"),
    ("coordination.k8s.io/v1", "Lease"): ("/apis/coordination.k8s.io/v1", "leases"),
    ("scheduling.k8s.io/v1alpha2", "PodGroup"): ("/apis/scheduling.k8s.io/v1alpha2", "podgroups"),
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): ("/apis/scheduling.volcano.sh/v1beta1", "podgroups"),
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): ("/apis/scheduling.x-k8s.io/v1alpha1", "podgroups"),
    (API_VERSION, KIND): (f"/apis/{API_VERSION}", PLURAL),
    # Read only, for a job in a Kueue LocalQueue: its gang's Workload and the queue's ClusterQueue.
    ("kueue.x-k8s.io/v1beta2", "Workload"): ("/apis/kueue.x-k8s.io/v1beta2", "workloads"),
    ("kueue.x-k8s.io/v1beta2", "LocalQueue"): ("/apis/kueue.x-k8s.io/v1beta2", "localqueues"),
}
# The kinds of a job's children that carry what a job passes through as written (volumes, env sources,
# tolerations, affinity): their dry run is Strict, as `kubectl apply` asks, so that a misspelt field is refused
# rather than dropped from the pods. The others are the operator's own rendering, and a PodGroup is another
# project's CRD, whose installed version may know fewer fields: their unknown fields stay the server's to drop.
STRICT_DRY_RUN_KINDS: Final = ("Pod", "Job")


def dry_run_query(kind: str) -> dict[str, str]:
    """The query of a server-side dry run of a `kind` (core/server_check.py): admitted and validated as a create,
    never stored."""
    return {"dryRun": "All", **({"fieldValidation": "Strict"} if kind in STRICT_DRY_RUN_KINDS else {})}

# --- torchrun's own variables: torchrun reads PET_<FLAG> as the default of --<flag> ---
ENV_NNODES = "PET_NNODES"
ENV_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
ENV_NODE_RANK = "PET_NODE_RANK"
ENV_MASTER_ADDR = "PET_MASTER_ADDR"
ENV_MASTER_PORT = "PET_MASTER_PORT"
# torchrun's --shutdown-timeout: how long, after SIGTERM, it waits for its workers to stop
# (they stop at a step boundary and rank 0 saves a checkpoint) before it kills them.
ENV_SHUTDOWN_TIMEOUT = "PET_SHUTDOWN_TIMEOUT"
DEFAULT_MASTER_PORT = 29500
# A worker pod's default terminationGracePeriodSeconds (spec.terminationGracePeriodSeconds).
DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS = 600
# Of the grace period, what torchrun does not give its workers: time for it to exit itself.
SHUTDOWN_MARGIN_SECONDS = 10

# --- dtrain's own variables ------------------------------------------------------
ENV_CONFIG = "DTRAIN_CONFIG"  # path of the trainer config (in a pod, from its annotation: TRAINER_FILE_ANNOTATIONS)
ENV_JOB_NAME = "DTRAIN_JOB_NAME"  # the DistributedTraining's name, for progress reports
ENV_JOB_NAMESPACE = "DTRAIN_JOB_NAMESPACE"  # its namespace (downward API in a pod)
# The worker's pod and Kubernetes node (downward API): named by the pre-flight check and the straggler report.
ENV_POD_NAME = "DTRAIN_POD_NAME"
ENV_NODE_NAME = "DTRAIN_NODE_NAME"
ENV_PROGRESS_SINK = "DTRAIN_PROGRESS_SINK"  # "operator" | "stdout" | "jsonl:<path>" | "none"
# Where rank 0 sends its records in a pod (sink "operator"): the operator's report Service over HTTPS.
ENV_OPERATOR_URL = "DTRAIN_OPERATOR_URL"
ENV_PROGRESS_INTERVAL = "DTRAIN_PROGRESS_INTERVAL_SECONDS"
ENV_TERMINATION_LOG = "DTRAIN_TERMINATION_LOG"  # where results JSON goes; default below
# The gang generation a pod was created for: its supervisor's first launch (dtrain_trainer.supervisor).
ENV_GANG_GENERATION = "DTRAIN_GANG_GENERATION"

PROGRESS_SINK_OPERATOR = "operator"
PROGRESS_SINK_STDOUT = "stdout"
PROGRESS_SINK_NONE = "none"
PROGRESS_SINK_JSONL_PREFIX = "jsonl:"
# status.progress.stage that rank 0 reports while it exports the model (the job's phase is then Exporting).
PROGRESS_STAGE_TRAINING = "training"
PROGRESS_STAGE_EXPORTING = "exporting"
# Rank 0 runs a validation loop (its batches count as progress) and writes a checkpoint (the
# progress deadline does not run meanwhile, nor while it exports).
PROGRESS_STAGE_VALIDATING = "validating"
PROGRESS_STAGE_CHECKPOINTING = "checkpointing"
# Training is over (rank 0 says so once fit returns): what is left (the export, leaving the process group, the
# processes' exit) completes no batch, and a slow exit is no hang.
PROGRESS_STAGE_FINISHING = "finishing"
# runPolicy.progressDeadlineSeconds when the spec does not say: ten minutes without a training or
# validation batch, a third of the default collective timeout (nccl.timeoutSeconds, 1800).
DEFAULT_PROGRESS_DEADLINE_SECONDS = 600
# How long one stage that holds the progress deadline (checkpointing, exporting, finishing) may last.
DEFAULT_STAGE_DEADLINE_SECONDS = 1800
DEFAULT_PROGRESS_INTERVAL_SECONDS = 15.0
# The shortest runPolicy.progressDeadlineSeconds but 0 (off). Rank 0 sends a record at the first batch end at least
# one report interval after the last, so a healthy gang's records reach the operator up to an interval, a step and
# their delivery apart: twice the interval leaves one interval for the step and the delivery. A shorter deadline
# restarts healthy gangs until BackoffLimitExceeded. (`dtrain run` reports more often; the same file runs on both.)
MIN_PROGRESS_DEADLINE_SECONDS = 2 * int(DEFAULT_PROGRESS_INTERVAL_SECONDS)

# The trainer's exit code for an error that no restart can cure: a classPath that does not import,
# initArgs the class refuses, a checkpoint directory it cannot write, a model it cannot export,
# a full disk. The restart policy fails the job at once on it, under every restartPolicy
# (sysexits.h's EX_CONFIG; 1 and 2 stay Python's and argparse's own).
TRAINER_EXIT_INVALID_CONFIG = 78
# A process ended by signal N exits 128 + N, as the shell, torchrun and the kubelet report it.
SIGNAL_EXIT_BASE = 128

TERMINATION_LOG_PATH = "/dev/termination-log"
# Keys of the trainer's results (its termination message) that the operator and `dtrain run` read.
# exportError: training succeeded but the ONNX export or its check failed; the exporter's message.
RESULTS_KEY_EXPORT_ERROR = "exportError"
TERMINATION_MESSAGE_MAX_BYTES = 4096

CONFIG_MOUNT_DIR = "/etc/dtrain"
CONFIG_FILE_NAME = "config.yaml"
CONFIG_PATH = f"{CONFIG_MOUNT_DIR}/{CONFIG_FILE_NAME}"
# The certificate authority of the operator's report endpoint, beside the config.
OPERATOR_CA_FILE_NAME = "operator-ca.crt"
OPERATOR_CA_PATH = f"{CONFIG_MOUNT_DIR}/{OPERATOR_CA_FILE_NAME}"
# A worker pod carries the files of CONFIG_MOUNT_DIR in these annotations, which a downward API volume mounts:
# no object of its own to create, read back or have taken by someone else's of the same name.
TRAINER_FILE_ANNOTATIONS = {
    CONFIG_FILE_NAME: f"{GROUP}/trainer-config",
    OPERATOR_CA_FILE_NAME: f"{GROUP}/operator-ca",
}

# --- Progress reports: rank 0 to the operator (HTTPS), the operator alone writes status ---
# Rank 0's pod holds a projected service-account token for this audience only: the API server
# refuses it (its own audience differs), the operator checks it with a TokenReview and reads the
# pod it is bound to. Worker pods mount no token for the API server.
OPERATOR_TOKEN_AUDIENCE = "dtrain.dev/operator"
OPERATOR_TOKEN_VOLUME = "dtrain-operator-token"
OPERATOR_TOKEN_DIR = "/var/run/secrets/dtrain.dev/operator"
OPERATOR_TOKEN_FILE_NAME = "token"
OPERATOR_TOKEN_PATH = f"{OPERATOR_TOKEN_DIR}/{OPERATOR_TOKEN_FILE_NAME}"
# The kubelet refreshes a projected token at 80% of its life; the trainer reads the file at each send.
OPERATOR_TOKEN_SECONDS = 3600
DEFAULT_REPORT_PORT = 8443
# One report (every pending record, as JSON): far more than the trainer sends (a few hundred bytes a record, a
# hang's stacks at most MAX_HANG_RECORD_BYTES), far less than memory.
MAX_REPORT_BYTES = 32768
MAX_HANG_RECORD_BYTES = 12288


def report_path(namespace: str, name: str) -> str:
    """The URL path at which the operator takes rank 0's records of one job."""
    return f"/v1/namespaces/{namespace}/{PLURAL}/{name}/records"


def launch_path(namespace: str, name: str) -> str:
    """The URL path at which each worker pod's supervisor reports its launch and asks what to do (api.launches)."""
    return f"/v1/namespaces/{namespace}/{PLURAL}/{name}/launches"

# The volumes the operator adds to the pods (the config, /dev/shm, spec.storage's claim or the pod-local
# /workspace, the gs:// credentials, rank 0's token): a job's own volumes may not take their names, nor its
# mounts their places.
CONFIG_VOLUME = "dtrain-config"
SHM_VOLUME = "dshm"
STORAGE_VOLUME = "dtrain-storage"
GCS_CREDENTIALS_VOLUME = "dtrain-gcs-credentials"
SHM_MOUNT_PATH = "/dev/shm"
GCS_CREDENTIALS_DIR = "/var/run/secrets/dtrain/gcs"
OPERATOR_VOLUMES = (CONFIG_VOLUME, SHM_VOLUME, STORAGE_VOLUME, GCS_CREDENTIALS_VOLUME, OPERATOR_TOKEN_VOLUME)
# Where the operator mounts each volume but the storage (whose place is spec.storage's), and what it holds.
OPERATOR_MOUNT_PATHS = {
    CONFIG_MOUNT_DIR: "the trainer's config",
    SHM_MOUNT_PATH: "shared memory",
    GCS_CREDENTIALS_DIR: "the gs:// credentials of spec.storage.credentialsSecret",
    OPERATOR_TOKEN_DIR: "rank 0's token for the operator",
}

# Names a user's `env` may not set: torchrun's contract, what torchrun itself
# sets in each process, and dtrain's own variables.
RESERVED_ENV_NAMES = frozenset(
    {
        ENV_NNODES,
        ENV_NPROC_PER_NODE,
        ENV_NODE_RANK,
        ENV_MASTER_ADDR,
        ENV_MASTER_PORT,
        ENV_SHUTDOWN_TIMEOUT,
        ENV_CONFIG,
        ENV_JOB_NAME,
        ENV_JOB_NAMESPACE,
        ENV_POD_NAME,
        ENV_NODE_NAME,
        ENV_PROGRESS_SINK,
        ENV_OPERATOR_URL,
        ENV_PROGRESS_INTERVAL,
        ENV_TERMINATION_LOG,
        ENV_GANG_GENERATION,
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
    }
)
RESERVED_ENV_PREFIXES = ("PET_", "DTRAIN_")
# NCCL variables belong in spec.nccl so that there is one place to read them.
NCCL_ENV_PATTERN = r"^(NCCL|TORCH_NCCL)_[A-Z0-9_]+$"

# --- Labels and annotations on every child ------------------------------------------
LABEL_JOB_NAME = f"{GROUP}/job-name"
LABEL_ROLE = f"{GROUP}/role"
LABEL_NODE_RANK = f"{GROUP}/node-rank"
# The gang generation a worker pod belongs to: bumped by every gang restart, so
# that pods of an older generation are recognised and never mistaken for the new gang.
LABEL_GANG_GENERATION = f"{GROUP}/gang-generation"
# On the DistributedTraining: `dtrain submit`'s per-GPU memory estimate of its spec (api/memory_estimate.py),
# which the operator, having no torch to build the model, turns into the GPUMemoryExceeded condition.
ANNOTATION_MEMORY_ESTIMATE = f"{GROUP}/memory-estimate"

ROLE_WORKER = "worker"
ROLE_ENGINE = "engine"
# A pod that holds the place of a node an elastic gang has lost (spec.elastic): it runs nothing, and once every
# one of them is placed the gang grows back at its next checkpoint.
ROLE_STANDBY = "standby"

# The node label of NVIDIA's GPU feature discovery that carries one GPU's memory, in MiB: where a job's
# scheduling.nodeSelector names it, that is the memory of the GPUs it runs on.
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"

# Prefix for kopf's own bookkeeping (progress annotations, last-handled state, finalizer).
KOPF_PREFIX = GROUP
FINALIZER = f"{GROUP}/finalizer"
# On a namespace: an administrator allows jobs there to use hostNetwork and hostPath volumes
# (only consulted when the operator runs with --refuse-host-access).
LABEL_ALLOW_HOST_ACCESS = f"{GROUP}/allow-host-access"

# --- Files in checkpoint.dir -----------------------------------------------------------
# The newest checkpoint, rewritten at every save and at the end of training.
LAST_CHECKPOINT_FILE_NAME = "last.ckpt"
# On object storage (s3://, gs://) no checkpoint is uploaded twice: the newest is named by this small object,
# written only after the checkpoint's own upload completed, so that the pointer never names a partial upload.
LAST_POINTER_FILE_NAME = "last.json"
# The key under which every checkpoint records the job it belongs to (api.storage.CheckpointOwner).
CHECKPOINT_OWNER_KEY = "dtrain_owner"
# The key under which a checkpoint written by a surviving rank, after a peer was lost, says so
# (api.storage.SurvivorMark); last.json carries the same mark under "survivor".
CHECKPOINT_SURVIVOR_KEY = "dtrain_survivor"
# Survivors of a lost peer name themselves in checkpoint.dir with small files of this prefix, to choose
# the one of them that writes (dtrain_trainer.survivor).
SURVIVOR_CLAIM_PREFIX = ".survivor-claim."

# --- Files in artifacts.dir ------------------------------------------------------------
ONNX_FILE_NAME = "model.onnx"
ARTIFACTS_FILE_NAME = "artifacts.json"
ENGINE_FILE_NAME = "model.plan"
ENGINE_REPORT_FILE_NAME = "engine-report.json"
# TensorRT's timing cache, kept beside the engine so that a rebuild on the same GPU is faster.
TIMING_CACHE_FILE_NAME = "timing.cache"
# Keys of artifacts.json that `dtrain build-engine` reads to load the PyTorch model for its
# eager baseline and reference: the checkpoint model.onnx was exported from (a path, absolute
# or relative to artifacts.json, or an object with a "path" key) and the model's class as
# {"classPath": ..., "initArgs": {...}} (the spec's `model`).
ARTIFACTS_KEY_CHECKPOINT = "checkpoint"
ARTIFACTS_KEY_MODEL = "model"

# Where a hang's stacks go (dtrain_trainer.hang_watch): <artifacts.dir>/hangs/<time>-step-<step>/, holding every
# rank's stacks (all threads) in one text file, the summary rank 0 sent, and each rank's flight recorder dump.
HANGS_DIR_NAME = "hangs"
STACKS_FILE_NAME = "stacks.txt"
HANG_SUMMARY_FILE_NAME = "hang.json"
FLIGHT_RECORDER_FILE_PREFIX = "flight-recorder-rank-"
# PyTorch's flight recorder (the last collectives of each process group, per rank): on for GPU jobs (NCCL) with
# this many entries; dumped by each rank when rank 0 collects a hang's stacks, and by NCCL itself when a
# collective times out (TORCH_NCCL_DUMP_ON_TIMEOUT) to the files TORCH_FR_DUMP_TEMP_FILE + rank.
ENV_FLIGHT_RECORDER_BUFFER = "TORCH_FR_BUFFER_SIZE"
# Its older name, which torch 2.14 still reads (with a deprecation warning): a user's spec.nccl.env may set it.
ENV_FLIGHT_RECORDER_BUFFER_OLD_NAME = "TORCH_NCCL_TRACE_BUFFER_SIZE"
ENV_FLIGHT_RECORDER_DUMP_FILE = "TORCH_FR_DUMP_TEMP_FILE"
ENV_NCCL_DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
FLIGHT_RECORDER_ENTRIES = 2000
NCCL_TIMEOUT_DUMP_PREFIX = "nccl-timeout-rank-"

# --- Defaults for the images ------------------------------------------------------------
DEFAULT_TRAINER_IMAGE = "ghcr.io/dtrain-dev/dtrain-trainer:0.1.0"
DEFAULT_ENGINE_IMAGE = "ghcr.io/dtrain-dev/dtrain-engine:0.1.0"
DEFAULT_WORKER_SERVICE_ACCOUNT = "dtrain-trainer"
# The user of the trainer and engine images; worker and engine pods use it as fsGroup so
# that both can write checkpoints and artifacts on the shared volume.
WORKLOAD_UID = 10001
# Its group: 0, so that an arbitrary UID assigned by the platform (OpenShift) can still write its home.
WORKLOAD_GID = 0


def is_reserved_env_name(name: str) -> bool:
    """True when a user's `env` may not set `name` (the operator sets it)."""
    return name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES)

# What each rank fetches from each of its ring neighbours at a comparison (the trainer's link probe):
# large enough that the time is the link's sending speed, not its latency or the machine's scheduling
# (0.7 ms at 100 Gb/s, 67 ms at 1 Gb/s), small enough to cost nothing every few steps.
LINK_PROBE_BYTES = 8 << 20
