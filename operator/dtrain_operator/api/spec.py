"""`spec`: what to train, on how many nodes, how failures are handled and where pods go."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from dtrain_operator.api import contract
from dtrain_operator.api.artifacts import ArtifactSettings, EngineSettings, ExportSettings
from dtrain_operator.api.builtin_classes import (
    BUILTIN_MODEL,
    BUILTIN_SYNTHETIC_DATA,
    TRAINER_DATA_ARGUMENTS,
    init_args_problem,
)
from dtrain_operator.api.common import (
    CLASS_PATH_PATTERN,
    INT32_MAX,
    MAX_BATCH,
    MAX_CLASS_PATH_LENGTH,
    MAX_DURATION_SECONDS,
    MAX_MAP_ENTRIES,
    MAX_MEMORY_SIZE_LENGTH,
    MAX_OBJECT_NAME,
    MAX_PATH_LENGTH,
    MAX_SEED,
    MAX_TIMEOUT_SECONDS,
    MEMORY_SIZE_PATTERN,
    ApiModel,
    DnsSubdomain,
    EnvVar,
    ImageReference,
    InitArgs,
    LocalObjectReference,
    Precision,
    ProgressDeadlineSeconds,
    Resources,
)
from dtrain_operator.api.elastic import ElasticPolicy, sizes_problem, wanted_layout
from dtrain_operator.api.failure_rules import MAX_FAILURE_RULES, STRATEGY_IN_PLACE, FailureRule, RestartStrategy
from dtrain_operator.api.free_form import credential_paths
from dtrain_operator.api.kube_objects import Volume, VolumeMount, refusal
from dtrain_operator.api.pod_volumes import pod_volumes_problem
from dtrain_operator.api.redaction import holds_credential, is_credential_name
from dtrain_operator.api.safe_yaml import first_few
from dtrain_operator.api.scheduling import SchedulingSettings
from dtrain_operator.api.storage import Storage, StorageDir, storage_mount_path


class ClassSpec(ApiModel):
    """A class to instantiate, in LightningCLI's shape: classPath + initArgs."""

    class_path: Annotated[str, Field(pattern=CLASS_PATH_PATTERN, max_length=MAX_CLASS_PATH_LENGTH)]
    """Importable path of the class: for model, e.g. dtrain_trainer.models.ImageClassifier or mypkg.MyModule; for data, e.g. dtrain_trainer.digits.DigitsDataModule or mypkg.MyDataModule."""
    init_args: InitArgs = Field(default_factory=dict)
    """Keyword arguments for the class's constructor. They are stored in the job's worker pods (an annotation), which anyone who may view the namespace can read: never put a credential here; pass it with env[].valueFrom.secretKeyRef and read the variable in your class."""

    @field_validator("init_args")
    @classmethod
    def _no_credentials(cls, init_args: dict[str, Any]) -> dict[str, Any]:
        found = credential_paths(init_args, is_credential_name, holds_credential)
        if found:
            what = "looks like a credential" if len(found) == 1 else "look like credentials"
            raise ValueError(
                f"{first_few(found)} {what}; initArgs are stored in the worker pods, which namespace viewers "
                "can read: pass it with spec.env[].valueFrom.secretKeyRef and read the variable in your class"
            )
        return init_args


class TrainerSettings(ApiModel):
    """How Lightning's Trainer runs."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": '!has(self.limitTrainBatches) || self.limitTrainBatches <= 1.0 || double(int(self.limitTrainBatches)) == self.limitTrainBatches', "message": 'limitTrainBatches is a number of batches (an integer) or a fraction in (0, 1]'},
    ]})

    max_epochs: Annotated[int, Field(ge=1, le=1000000)] | None = None
    """Stop after this many epochs (default: 1, or no epoch limit when maxSteps is set)."""
    max_steps: Annotated[int, Field(ge=-1, le=INT32_MAX)] = -1
    """Stop after this many optimizer steps (-1: no step limit). Whichever of maxEpochs and maxSteps comes first ends training."""
    precision: Precision = "32-true"
    """Numerical precision: 32-true, 16-mixed, bf16-mixed, bf16-true, 16-true or 64-true. 16-mixed needs a GPU; on a CPU it falls back to 32-true with a warning."""
    gradient_clip_val: Annotated[float, Field(ge=0, le=1000000.0)] | None = None
    """Clip gradients to this value (none: no clipping)."""
    gradient_clip_algorithm: Literal["norm", "value"] = "norm"
    """How gradients are clipped: by total norm or by value."""
    accumulate_grad_batches: Annotated[int, Field(ge=1, le=MAX_BATCH)] = 1
    """Accumulate gradients over this many batches before each optimizer step."""
    find_unused_parameters: bool = False
    """DDP's find_unused_parameters: needed only for models with parameters that some steps do not use; it slows training."""
    batch_size: Annotated[int, Field(ge=1, le=1_048_576)] = 32
    """Batch size per process (per GPU). The global batch is batchSize x devicesPerNode x nodes x accumulateGradBatches."""
    num_workers: Annotated[int, Field(ge=0, le=256)] = 4
    """Data-loader worker processes per training process."""
    log_every_n_steps: Annotated[int, Field(ge=1, le=INT32_MAX)] = 50
    """Log metrics every this many steps."""
    limit_train_batches: Annotated[int, Field(ge=1, le=INT32_MAX)] | Annotated[float, Field(gt=0, le=1)] | None = None
    """Use only this many training batches per epoch (an integer) or this fraction of them (a number in (0, 1])."""
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 42
    """Random seed for every rank (each data-loader worker is seeded from it)."""

    @property
    def resolved_max_epochs(self) -> int:
        """Lightning's max_epochs: maxEpochs when set; -1 (no limit) when only maxSteps is; else 1."""
        if self.max_epochs is not None:
            return self.max_epochs
        return -1 if self.max_steps > 0 else 1


class LoggingSettings(ApiModel):
    """Where the metrics Lightning logs go, and which of them dtrain reports."""

    logger: Literal["tensorboard", "csv", "mlflow"] = "tensorboard"
    """tensorboard: event files in <artifacts.dir>/logs (tensorboard --logdir there). csv: <artifacts.dir>/logs/version_0/metrics.csv. mlflow: an MLflow run named after the job (the image needs mlflow or mlflow-skinny). A gang restart continues the same log."""
    mlflow_tracking_uri: Annotated[str, Field(min_length=1, max_length=MAX_PATH_LENGTH)] | None = None
    """MLflow tracking server for logger mlflow, e.g. http://mlflow.mlops:5000 (default: MLFLOW_TRACKING_URI from the environment, e.g. spec.env). No credentials here: it is stored in the job's worker pods; set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) with spec.env[].valueFrom.secretKeyRef."""
    mlflow_experiment_name: Annotated[str, Field(min_length=1, max_length=MAX_OBJECT_NAME)] | None = None
    """MLflow experiment for logger mlflow (default: the job's name)."""
    metrics: Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_OBJECT_NAME)]], Field(max_length=32)] = Field(default_factory=list)
    """Metrics the model logs (self.log) that progress, status.progress.metrics and the summary report, besides val_loss, val_acc and every metric logged with prog_bar=True."""


    @field_validator("mlflow_tracking_uri")
    @classmethod
    def _no_credentials(cls, uri: str | None) -> str | None:
        if uri is not None and holds_credential(uri):
            raise ValueError(
                "holds a credential; it is stored in the worker pods, which namespace viewers can read: set "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) from a Secret "
                "with spec.env[].valueFrom.secretKeyRef"
            )
        return uri


NcclDebug = Literal["VERSION", "WARN", "INFO", "TRACE"]


class CollectiveTimeouts(ApiModel):
    """The trainer's part of spec.nccl, which reaches it in its config: how long its collectives wait.

    The rest of spec.nccl is NCCL's own and reaches NCCL as NCCL_* variables only (core.launch_env)."""

    timeout_seconds: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] = 1800
    """Collective timeout of the process group: a rank that waits longer fails, and the gang restarts."""
    preflight_timeout_seconds: Annotated[int, Field(ge=0, le=MAX_TIMEOUT_SECONDS)] = 60
    """Before the model is built, every rank checks that the interfaces of NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME exist in its pod, joins the others and times an all-reduce (status.preflight). A rank that has not joined within this many seconds fails the job at once (reason InvalidTrainerConfig), naming the missing ranks, the address and the NCCL/gloo variables in effect, instead of hanging until timeoutSeconds. The ranks start together (torchrun waits for every node first), so a minute is plenty. 0 skips the join and the all-reduce (the interface check still runs)."""


class NcclSettings(CollectiveTimeouts):
    """NCCL settings for the worker pods: NCCL_* variables, and the collectives' timeouts."""

    ib_disable: bool | None = None
    """NCCL_IB_DISABLE: true to stop NCCL using InfiniBand/RoCE (e.g. on plain Ethernet clusters)."""
    socket_ifname: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """NCCL_SOCKET_IFNAME: the network interface(s) NCCL uses, e.g. eth0 or ^lo,docker."""
    debug: NcclDebug | None = None
    """NCCL_DEBUG: VERSION, WARN, INFO or TRACE."""
    p2p_disable: Annotated[bool | None, Field(alias="p2pDisable")] = None
    """NCCL_P2P_DISABLE: true to disable peer-to-peer GPU transfers (NVLink/PCIe)."""
    env: Annotated[
        dict[Annotated[str, Field(pattern=contract.NCCL_ENV_PATTERN)], Annotated[str, Field(max_length=4096)]],
        Field(max_length=MAX_MAP_ENTRIES),
    ] = Field(default_factory=dict)
    """Any other NCCL_* or TORCH_NCCL_* variable, e.g. {NCCL_ALGO: Ring}."""

    @model_validator(mode="after")
    def _no_double_setting(self) -> NcclSettings:
        named = {
            "NCCL_IB_DISABLE": "ibDisable",
            "NCCL_SOCKET_IFNAME": "socketIfname",
            "NCCL_DEBUG": "debug",
            "NCCL_P2P_DISABLE": "p2pDisable",
        }
        for key in self.env:
            if key in named:
                raise ValueError(f"env.{key} repeats the field {named[key]}: set only spec.nccl.{named[key]}")
        return self

    def to_env(self) -> dict[str, str]:
        """The NCCL_* and TORCH_NCCL_* variables these settings stand for."""
        env: dict[str, str] = {}
        if self.ib_disable is not None:
            env["NCCL_IB_DISABLE"] = "1" if self.ib_disable else "0"
        if self.socket_ifname is not None:
            env["NCCL_SOCKET_IFNAME"] = self.socket_ifname
        if self.debug is not None:
            env["NCCL_DEBUG"] = self.debug
        if self.p2p_disable is not None:
            env["NCCL_P2P_DISABLE"] = "1" if self.p2p_disable else "0"
        env.update(self.env)
        return env


class StragglerSettings(ApiModel):
    """Straggler detection: every rank's step time and link speed, compared every few steps (no restart)."""

    every_n_steps: Annotated[int, Field(ge=0, le=1_000_000)] = 50
    """Compare the ranks every this many optimizer steps (each rank fetches 8 MiB from each ring neighbour, best of 3, and all-gathers three numbers); 0 turns detection off."""
    factor: Annotated[float, Field(ge=1.05, le=100)] = 1.5
    """A rank whose step time (forward and loss) or link time (8 MiB fetched from it; never under 5 ms) exceeds this many times the median of all ranks is slow."""
    window: Annotated[int, Field(ge=1, le=1000)] = 3
    """Consecutive comparisons a rank must be slow in before it is reported (a Warning Event and the Straggler condition, naming its pod and node)."""


class CheckpointSettings(ApiModel):
    """Where and how often checkpoints are written. A gang restart resumes from the last one."""

    dir: StorageDir | None = None
    """Directory for checkpoints: an absolute path on a volume that outlives the pod (spec.storage's claim), or s3://bucket/prefix or gs://bucket/prefix (default: <spec.storage.url or mountPath>/<namespace>/<name>/checkpoints)."""
    every_n_steps: Annotated[int, Field(ge=1, le=INT32_MAX)] = 500
    """Save a checkpoint every this many optimizer steps (and always at the end)."""
    keep_last: Annotated[int, Field(ge=1, le=1000)] = 3
    """Keep this many step checkpoints besides last.ckpt."""
    on_write_failure: Literal["Continue", "Fail"] = "Continue"
    """A checkpoint that cannot be uploaded to object storage after its retries: Continue (report it, the CheckpointMissed condition and Warning Event, and train on; the next checkpoint tries again) or Fail (stop training: the worker exits with code 1, and restartPolicy decides, e.g. a gang restart from the last checkpoint written)."""
    foreign: Literal["Refuse", "StartFresh", "Resume"] = "Refuse"
    """What the trainer does when dir holds the checkpoint of another job, of an earlier job of the same name, or of this job with another model, data or trainer spec: Refuse (fail with exit 78, naming it), StartFresh (train from scratch with a Warning; its checkpoints then replace the other's) or Resume (resume from it all the same, with a Warning)."""


class RunPolicy(ApiModel):
    """How failures, deadlines and cleanup are handled."""

    restart_policy: Literal["OnFailure", "ExitCode", "Never"] = "OnFailure"
    """OnFailure: any worker failure restarts the gang. ExitCode: exit codes 1-127 (a bug in the job) fail it at once, 128+ and evictions restart. Never: the first failure fails the job. Under every policy, the trainer's exit code 78 (a classPath, initArgs, checkpoint directory or model export that cannot work) fails the job at once with reason InvalidTrainerConfig. Each policy is a list of failure rules that comes after failureRules (see there)."""
    failure_rules: Annotated[list[FailureRule], Field(max_length=MAX_FAILURE_RULES)] = Field(default_factory=list)
    """Rules for failed workers, tried in order: the first rule that matches one of the failures that stopped the gang decides (as JobSet's failurePolicy.rules), and the status condition and the Event name it (failureRules[1] ... decided). A failure no rule matches is decided by restartPolicy, which is the rule list that follows yours: OnFailure is [{action: FailJob, onReasons: [InvalidTrainerConfig]}, {action: RestartGang}]; ExitCode is [{action: FailJob, onReasons: [InvalidTrainerConfig]}, {action: RestartGang, onExitCodes: ["128-255"]}, {action: RestartGang, onReasons: [Lost]}, {action: FailJob}]; Never is [{action: FailJob, onReasons: [InvalidTrainerConfig]}, {action: FailJob}]. The failures that stopped the gang are the first ones (those within a second of the first) and every lost worker, not its peers' errors that followed. A Kueue eviction is no failure: the gang is queued again whatever the rules say. A gang past progressDeadlineSeconds is not decided by these rules."""
    backoff_limit: Annotated[int, Field(ge=0, le=1000)] = 3
    """Gang restarts allowed before the job fails with BackoffLimitExceeded."""
    restart_strategy: RestartStrategy = STRATEGY_IN_PLACE
    """How a gang restarts. InPlace: when every worker pod and its node are still there (a trainer process that crashed, a collective error, a hang), each pod's supervisor stops torchrun and, once every pod's has, starts it again from the last checkpoint, in the same pods: no rescheduling, image pull or volume attach. A pod or node that is gone, an eviction, a preemption, an OOM kill, a pod cut off from the operator, or an in-place restart that does not start within its grace period plus 30 s recreates the pods instead. Recreate: always delete the gang's pods and create new ones. Either way it counts as a gang restart (backoffLimit) and resumes exactly; status.lastRestart and the Restarting Event say which was used and why (a RestartByRecreate Event when an in-place restart falls back). A failure rule's restartStrategy overrides it."""
    active_deadline_seconds: Annotated[int, Field(ge=1, le=MAX_DURATION_SECONDS)] | None = None
    """Fail the job (DeadlineExceeded) when it runs longer than this, counted from its start."""
    progress_deadline_seconds: ProgressDeadlineSeconds = contract.DEFAULT_PROGRESS_DEADLINE_SECONDS
    """Restart the gang from its last checkpoint (reason ProgressDeadlineExceeded, counted against backoffLimit) when every worker runs but no training or validation batch completes for this many seconds: a rank stuck in a collective, a dead data loader. Time spent writing a checkpoint, exporting the model or ending the processes after training does not count. Make it longer than your slowest step and your first step after a start (data loading, compilation); at least 30 (twice the 15 s in which rank 0 reports); well under nccl.timeoutSeconds, which it is meant to beat. 0 turns it off. Default 600. It is also the grace period of the other workers when one fails or is lost (at most terminationGracePeriodSeconds): without the lost rank they cannot checkpoint on SIGTERM, and one whose peer's node is gone waits in its collective."""
    stage_deadline_seconds: Annotated[int, Field(ge=0, le=MAX_DURATION_SECONDS)] = contract.DEFAULT_STAGE_DEADLINE_SECONDS
    """How long rank 0 may stay in one of the stages that hold the progress deadline (checkpointing, exporting the model, finishing: ending the processes after training) before the gang is handled as hung (ProgressDeadlineExceeded: restarted from its last checkpoint or failed, as for a hang): no stage holds a job for ever. Make it longer than writing your largest checkpoint and exporting your model take. 0 turns it off; it needs progressDeadlineSeconds. Default 1800."""
    ttl_seconds_after_finished: Annotated[int, Field(ge=0, le=MAX_DURATION_SECONDS)] | None = None
    """Delete the DistributedTraining this long after it succeeded or failed (none: keep it)."""
    clean_pod_policy: Literal["Running", "All", "None"] = "Running"
    """Pods deleted when the job finishes: Running (those still running), All, or None (keep them for debugging)."""
    suspend: bool = False
    """True stops the job: worker pods are deleted; false starts them again and training resumes from its checkpoint."""


ELASTIC_LIMIT_MESSAGE = (
    "trainer.limitTrainBatches counts a process's batches, which an elastic gang changes with its size; "
    "leave it out of an elastic job (trainer.maxSteps bounds the run)"
)


ELASTIC_GANG_MESSAGE = (
    "elastic cannot be combined with scheduling.gang yet: the gang's PodGroup is of nodes pods, so a smaller gang "
    "would never be placed; leave one of them out"
)


class DistributedTrainingSpec(ApiModel):
    """What to train, on how many nodes, and what to build from it."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        # The CRD stores no defaults (api.crd): every rule reads an absent field as its default.
        {"rule": '!has(self.scheduling) || !has(self.scheduling.gang) || !has(self.scheduling.gang.minAvailable) || self.scheduling.gang.minAvailable <= (has(self.nodes) ? self.nodes : 1)', "message": 'scheduling.gang.minAvailable cannot exceed nodes'},
        {"rule": '(has(self.engine) && has(self.engine.enabled) && !self.engine.enabled) || !has(self.export) || !has(self.export.onnx) || !has(self.export.onnx.enabled) || self.export.onnx.enabled', "message": 'engine.enabled needs export.onnx.enabled: the engine is built from model.onnx'},
        {"rule": '!has(self.elastic) || self.elastic.minNodes <= (has(self.nodes) ? self.nodes : 1)', "message": 'elastic.minNodes cannot exceed nodes'},
        {"rule": '!has(self.elastic) || !has(self.trainer) || !has(self.trainer.limitTrainBatches)', "message": ELASTIC_LIMIT_MESSAGE},
        {"rule": '!has(self.elastic) || !has(self.scheduling) || !has(self.scheduling.gang) || !has(self.scheduling.gang.enabled) || !self.scheduling.gang.enabled', "message": ELASTIC_GANG_MESSAGE},
    ]})

    image: ImageReference = contract.DEFAULT_TRAINER_IMAGE
    """Trainer image: dtrain's trainer image or one built FROM it with your own code."""
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """When the kubelet pulls the image."""
    image_pull_secrets: Annotated[list[LocalObjectReference], Field(max_length=16)] = Field(default_factory=list)
    """Secrets for pulling the trainer and engine images."""
    nodes: Annotated[int, Field(ge=1, le=4096)] = 1
    """Number of worker pods (one per machine)."""
    devices_per_node: Annotated[int, Field(ge=1, le=64)] = 1
    """Training processes per pod: one per GPU with accelerator gpu."""
    accelerator: Literal["gpu", "cpu"] = "gpu"
    """gpu: each pod requests devicesPerNode nvidia.com/gpu and uses NCCL. cpu: processes use gloo."""
    gpu_memory: Annotated[str, Field(max_length=MAX_MEMORY_SIZE_LENGTH, pattern=MEMORY_SIZE_PATTERN)] | None = None
    """Memory of one GPU of the nodes the job runs on, e.g. 32Gi or 80G (default: the nvidia.com/gpu.memory label, in MiB, where scheduling.nodeSelector names it). The operator compares it with the per-GPU memory estimate that `dtrain submit` records in the dtrain.dev/memory-estimate annotation: a batch that does not fit gets the GPUMemoryExceeded condition and a Warning Event at creation; nothing is refused."""
    resources: Resources | None = None
    """CPU and memory of each worker container (its nvidia.com/gpu limit is set from devicesPerNode when the accelerator is gpu)."""
    env: Annotated[list[EnvVar], Field(max_length=256)] = Field(default_factory=list)
    """Extra environment variables of the trainer container."""
    volumes: Annotated[list[Volume], Field(max_length=64)] = Field(default_factory=list)
    """Extra volumes of the worker pods (core/v1 Volume), e.g. a PVC with the data set."""
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=64)] = Field(default_factory=list)
    """Extra volume mounts of the trainer container (core/v1 VolumeMount)."""
    host_network: bool = False
    """Run worker pods in the host's network namespace. Only some NCCL/RDMA setups need this; it weakens isolation."""
    service_account_name: DnsSubdomain = contract.DEFAULT_WORKER_SERVICE_ACCOUNT
    """Service account of the worker pods: it needs no permission (rank 0 reports progress to the operator with a token bound to its pod)."""
    master_port: Annotated[int, Field(ge=1024, le=65535)] = contract.DEFAULT_MASTER_PORT
    """Port of torchrun's rendezvous on node 0."""
    termination_grace_period_seconds: Annotated[int, Field(ge=15, le=86400)] = (
        contract.DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS
    )
    """Seconds a worker pod has after SIGTERM (preemption, a node drain, kubectl delete) before it is killed. In that time every rank stops at the next optimizer step and rank 0 saves a checkpoint, so that the restarted gang loses no work. Make it longer than writing one checkpoint of your model takes (minutes for a large model on network storage); the default is 600."""
    storage: Storage | None = None
    """Where checkpoints and artifacts are shared: a ReadWriteMany PVC (claimName) or object storage (url). A job with more than one node or with the engine step needs it; without it a single-node job writes to a pod-local emptyDir at /workspace that dies with the pod."""
    model: ClassSpec = Field(default_factory=lambda: ClassSpec(class_path=BUILTIN_MODEL))
    """The LightningModule to train (default: the built-in torchvision image classifier, resnet50)."""
    data: ClassSpec = Field(default_factory=lambda: ClassSpec(class_path=BUILTIN_SYNTHETIC_DATA))
    """The LightningDataModule (default: synthetic images; dtrain_trainer.data.ImageFolderDataModule reads a directory tree)."""
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    """Lightning Trainer settings."""
    nccl: NcclSettings = Field(default_factory=NcclSettings)
    """NCCL settings."""
    stragglers: StragglerSettings = Field(default_factory=StragglerSettings)
    """Straggler detection: a rank much slower than the others is named (pod and node) in status.progress, a Warning Event and the Straggler condition."""
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    """Checkpoints."""
    artifacts: ArtifactSettings = Field(default_factory=ArtifactSettings)
    """Where the exported model and engine are written."""
    export: ExportSettings = Field(default_factory=ExportSettings)
    """Exports at the end of training."""
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    """The logger (TensorBoard, CSV or MLflow) and the metrics dtrain reports."""
    engine: EngineSettings = Field(default_factory=EngineSettings)
    """The TensorRT engine build that follows training."""
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    """Restarts, deadlines, suspension and cleanup."""
    scheduling: SchedulingSettings = Field(default_factory=SchedulingSettings)
    """Scheduling of the worker pods."""
    elastic: ElasticPolicy | None = None
    """Keep training on fewer nodes (down to minNodes) when worker pods cannot be placed for waitSeconds, and grow back to nodes at the first checkpoint after they can; the global batch and the epoch's sample order stay exactly those of nodes. A resize restarts the gang from its last checkpoint without counting against runPolicy.backoffLimit. None: the gang is always nodes."""

    @model_validator(mode="after")
    def _elastic_sizes_keep_the_batch(self) -> DistributedTrainingSpec:
        if self.elastic is None:
            return self
        if self.elastic.min_nodes > self.nodes:
            raise refusal(".elastic.minNodes", f"{self.elastic.min_nodes} cannot exceed nodes ({self.nodes})")
        if self.trainer.limit_train_batches is not None:
            raise refusal(".trainer.limitTrainBatches", ELASTIC_LIMIT_MESSAGE)
        if self.scheduling.gang.enabled:
            raise refusal(".scheduling.gang.enabled", ELASTIC_GANG_MESSAGE)
        settings = self.trainer
        wanted = wanted_layout(settings.batch_size, settings.accumulate_grad_batches, self.devices_per_node, self.nodes)
        problem = sizes_problem(wanted, self.devices_per_node, self.elastic.min_nodes, self.nodes)
        if problem:
            raise refusal(".elastic.minNodes", problem)
        return self

    @model_validator(mode="after")
    def _cross_field(self) -> DistributedTrainingSpec:
        gang = self.scheduling.gang
        if gang.min_available is not None and gang.min_available > self.nodes:
            raise ValueError(
                f"scheduling.gang.minAvailable ({gang.min_available}) cannot exceed nodes ({self.nodes})"
            )
        if self.engine.enabled and not self.export.onnx.enabled:
            raise ValueError("engine.enabled needs export.onnx.enabled: the engine is built from model.onnx")
        return self

    @model_validator(mode="after")
    def _volumes_fit_the_pods(self) -> DistributedTrainingSpec:
        dirs = (self.checkpoint.dir, self.artifacts.dir)
        problem = pod_volumes_problem(
            self.volumes, self.volume_mounts, storage_mount_path(self.storage, self.volume_mounts, dirs)
        )
        if problem is not None:
            raise refusal(*problem)
        return self

    @model_validator(mode="after")
    def _init_args_the_classes_take(self) -> DistributedTrainingSpec:
        for field, named, passed in ((".model", self.model, {}), (".data", self.data, TRAINER_DATA_ARGUMENTS)):
            problem = init_args_problem(named.class_path, named.init_args, passed)
            if problem is not None:
                raise refusal(field + problem[0], problem[1])
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node


