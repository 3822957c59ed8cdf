"""The DistributedTraining API (`dtrain.dev/v1alpha1`): the single source of truth.

The CRD (`dtrain crd`), `dtrain validate`, the operator and the trainer all read
these models. Every field's docstring becomes its `kubectl explain` text, so it is
written for the person who types the YAML. Names follow Kubernetes conventions
(camelCase on the wire); core Kubernetes types (volumes, affinity, ...) are passed
through untouched and validated by the API server's own schemas.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator
from pydantic.alias_generators import to_camel

from . import contract
from .free_form import check_free_form, credential_keys
from .redaction import is_credential_name

# A Kubernetes object or list item whose schema the API server knows (Volume,
# Affinity, Toleration, ...). We pass it through and let the API server validate it.
KubeObject = Annotated[
    dict[str, Any],
    AfterValidator(check_free_form),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
# Free-form arguments for a user's class (LightningCLI's init_args).
InitArgs = Annotated[
    dict[str, Any],
    AfterValidator(check_free_form),
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# A resource quantity as Kubernetes writes it: 4, "500m", "16Gi".
Quantity = Annotated[
    Union[int, float, str],
    WithJsonSchema({"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}),
]
# One GPU's memory: a Kubernetes quantity with its unit (a bare number would be bytes, never meant).
MEMORY_SIZE_PATTERN = r"^[0-9]{1,9}(\.[0-9]{1,3})?(Ki|Mi|Gi|Ti|K|M|G|T)$"
MAX_MEMORY_SIZE_LENGTH = 16
DNS1035_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
# Pods are named `<name>-<rank>` and must be valid DNS labels (63 characters);
# the engine Job's pods add `-engine-xxxxx`. 45 leaves room for both.
MAX_NAME_LENGTH = 45
CLASS_PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

# Bounds on what a user may write. The API server estimates the worst-case cost of each CEL rule
# from the schema's maxLength/maxItems/maxProperties (an unbounded string counts as the whole 3 MiB
# request), so every string, list and map gets one; every integer gets a maximum so that no value
# that passes validation can overflow a datetime or a timedelta in the operator.
MAX_OBJECT_NAME = 253  # a DNS-1123 subdomain: Secrets, PVCs, service accounts, priority classes, schedulers
MAX_IMAGE_LENGTH = 1024
MAX_PATH_LENGTH = 4096
MAX_ENV_NAME_LENGTH = 256
MAX_ENV_VALUE_LENGTH = 32768
MAX_CLASS_PATH_LENGTH = 512
MAX_LABEL_VALUE_LENGTH = 63
MAX_MAP_ENTRIES = 64
INT32_MAX = 2**31 - 1
MAX_SEED = 2**32 - 1  # numpy's seed range, which Lightning's seed_everything uses
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600  # a week
MAX_DURATION_SECONDS = 10 * 365 * 24 * 3600  # ten years
MAX_BATCH = 65536

Precision = Literal["64-true", "32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"]
EnginePrecision = Literal["fp32", "fp16", "bf16", "int8"]
Phase = Literal[
    "Pending", "Starting", "Running", "Restarting", "Exporting", "BuildingEngine", "Succeeded", "Failed", "Suspended"
]
FINISHED_PHASES = ("Succeeded", "Failed")


class ApiModel(BaseModel):
    """Base of every API type: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=False,
        # JSON, and so the API server, has no infinity or NaN.
        allow_inf_nan=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as it is written in YAML and sent to the API server."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# --- Core types that dtrain looks into ----------------------------------------------


_RESERVED_CEL_LIST = "[" + ", ".join(f"'{n}'" for n in sorted(contract.RESERVED_ENV_NAMES)) + "]"


class LocalObjectReference(ApiModel):
    """A reference to an object in the same namespace."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_OBJECT_NAME)]
    """Name of the referenced object."""


class EnvVar(ApiModel):
    """An environment variable for the trainer container (core/v1 EnvVar)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!(self.name in " + _RESERVED_CEL_LIST + ") && !self.name.startsWith('PET_') && !self.name.startsWith('DTRAIN_')", "message": 'this name is reserved: the operator sets it for torchrun and the trainer'},
        {"rule": "!self.name.matches('^(NCCL|TORCH_NCCL)_')", "message": 'NCCL variables go under spec.nccl (or spec.nccl.env)'},
    ]})

    name: Annotated[str, Field(pattern=ENV_NAME_PATTERN, min_length=1, max_length=MAX_ENV_NAME_LENGTH)]
    """Name of the variable. Names the operator sets (PET_*, DTRAIN_*, MASTER_ADDR, RANK, ...) are reserved."""
    value: Optional[Annotated[str, Field(max_length=MAX_ENV_VALUE_LENGTH)]] = None
    """Value of the variable."""
    value_from: Optional[KubeObject] = None
    """Source of the value (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef)."""

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if contract.is_reserved_env_name(name):
            raise ValueError(f"{name} is reserved: the operator sets it for torchrun and the trainer; remove it")
        if re.match(contract.NCCL_ENV_PATTERN, name):
            raise ValueError(f"{name} is an NCCL setting: put it under spec.nccl (or spec.nccl.env) instead")
        return name


class Resources(ApiModel):
    """Compute resources of a container (core/v1 ResourceRequirements)."""

    limits: Annotated[dict[str, Annotated[Quantity, Field()]], Field(max_length=MAX_MAP_ENTRIES)] = Field(default_factory=dict)
    """Maximum resources, e.g. {cpu: 8, memory: 64Gi}. GPUs (nvidia.com/gpu) are set from devicesPerNode."""
    requests: Annotated[dict[str, Annotated[Quantity, Field()]], Field(max_length=MAX_MAP_ENTRIES)] = Field(default_factory=dict)
    """Minimum resources the scheduler reserves, e.g. {cpu: 8, memory: 64Gi}."""

    @field_validator("limits", "requests")
    @classmethod
    def _quantities(cls, values: dict[str, Any]) -> dict[str, Any]:
        for key, value in values.items():
            if isinstance(value, bool) or not re.match(QUANTITY_PATTERN, str(value)):
                raise ValueError(f"{key}: {value!r} is not a Kubernetes quantity (e.g. 4, 500m, 16Gi)")
        return values


# --- The spec -------------------------------------------------------------------


class ClassSpec(ApiModel):
    """A class to instantiate, in LightningCLI's shape: classPath + initArgs."""

    class_path: Annotated[str, Field(pattern=CLASS_PATH_PATTERN, max_length=MAX_CLASS_PATH_LENGTH)]
    """Importable path of the class, e.g. dtrain_trainer.models.ImageClassifier or mypkg.MyModule."""
    init_args: InitArgs = Field(default_factory=dict)
    """Keyword arguments for the class's constructor. They are stored in the job's ConfigMap, which anyone who may view the namespace can read: never put a credential here; pass it with env[].valueFrom.secretKeyRef and read the variable in your class."""

    @field_validator("init_args")
    @classmethod
    def _no_credentials(cls, init_args: dict[str, Any]) -> dict[str, Any]:
        found = credential_keys(init_args, is_credential_name)
        if found:
            raise ValueError(
                f"{', '.join(found)} looks like a credential; initArgs are stored in a ConfigMap that namespace viewers "
                "can read: pass it with spec.env[].valueFrom.secretKeyRef and read the variable in your class"
            )
        return init_args


BUILTIN_MODEL = "dtrain_trainer.models.ImageClassifier"
BUILTIN_SYNTHETIC_DATA = "dtrain_trainer.data.SyntheticImageDataModule"
BUILTIN_IMAGE_FOLDER_DATA = "dtrain_trainer.data.ImageFolderDataModule"


class TrainerSettings(ApiModel):
    """How Lightning's Trainer runs."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": '!has(self.limitTrainBatches) || self.limitTrainBatches <= 1.0 || double(int(self.limitTrainBatches)) == self.limitTrainBatches', "message": 'limitTrainBatches is a number of batches (an integer) or a fraction in (0, 1]'},
    ]})

    max_epochs: Optional[Annotated[int, Field(ge=1, le=1_000_000)]] = None
    """Stop after this many epochs (default: 1, or no epoch limit when maxSteps is set)."""
    max_steps: Annotated[int, Field(ge=-1, le=INT32_MAX)] = -1
    """Stop after this many optimizer steps (-1: no step limit). Whichever of maxEpochs and maxSteps comes first ends training."""
    precision: Precision = "32-true"
    """Numerical precision: 32-true, 16-mixed, bf16-mixed, bf16-true, 16-true or 64-true. 16-mixed needs a GPU; on a CPU it falls back to 32-true with a warning."""
    gradient_clip_val: Optional[Annotated[float, Field(ge=0, le=1e6)]] = None
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
    limit_train_batches: Optional[Union[Annotated[int, Field(ge=1, le=INT32_MAX)], Annotated[float, Field(gt=0, le=1)]]] = None
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
    mlflow_tracking_uri: Optional[Annotated[str, Field(min_length=1, max_length=MAX_PATH_LENGTH)]] = None
    """MLflow tracking server for logger mlflow, e.g. http://mlflow.mlops:5000 (default: MLFLOW_TRACKING_URI from the environment, e.g. spec.env)."""
    mlflow_experiment_name: Optional[Annotated[str, Field(min_length=1, max_length=MAX_OBJECT_NAME)]] = None
    """MLflow experiment for logger mlflow (default: the job's name)."""
    metrics: Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_OBJECT_NAME)]], Field(max_length=32)] = Field(default_factory=list)
    """Metrics the model logs (self.log) that progress, status.progress.metrics and the summary report, besides val_loss, val_acc and every metric logged with prog_bar=True."""


NcclDebug = Literal["VERSION", "WARN", "INFO", "TRACE"]


class NcclSettings(ApiModel):
    """NCCL settings for the worker pods, written to NCCL_* variables."""

    ib_disable: Optional[bool] = None
    """NCCL_IB_DISABLE: true to stop NCCL using InfiniBand/RoCE (e.g. on plain Ethernet clusters)."""
    socket_ifname: Optional[Annotated[str, Field(min_length=1, max_length=256)]] = None
    """NCCL_SOCKET_IFNAME: the network interface(s) NCCL uses, e.g. eth0 or ^lo,docker."""
    debug: Optional[NcclDebug] = None
    """NCCL_DEBUG: VERSION, WARN, INFO or TRACE."""
    p2p_disable: Annotated[Optional[bool], Field(alias="p2pDisable")] = None
    """NCCL_P2P_DISABLE: true to disable peer-to-peer GPU transfers (NVLink/PCIe)."""
    timeout_seconds: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] = 1800
    """Collective timeout of the process group: a rank that waits longer fails, and the gang restarts."""
    preflight_timeout_seconds: Annotated[int, Field(ge=0, le=MAX_TIMEOUT_SECONDS)] = 60
    """Before the model is built, every rank checks that the interfaces of NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME exist in its pod, joins the others and times an all-reduce (status.preflight). A rank that has not joined within this many seconds fails the job at once (reason InvalidTrainerConfig), naming the missing ranks, the address and the NCCL/gloo variables in effect, instead of hanging until timeoutSeconds. The ranks start together (torchrun waits for every node first), so a minute is plenty. 0 skips the join and the all-reduce (the interface check still runs)."""
    env: Annotated[
        dict[Annotated[str, Field(pattern=contract.NCCL_ENV_PATTERN)], Annotated[str, Field(max_length=4096)]],
        Field(max_length=MAX_MAP_ENTRIES),
    ] = Field(default_factory=dict)
    """Any other NCCL_* or TORCH_NCCL_* variable, e.g. {NCCL_ALGO: Ring}."""

    @model_validator(mode="after")
    def _no_double_setting(self) -> "NcclSettings":
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
    """Straggler detection: every rank's step time, compared every few steps (no restart)."""

    every_n_steps: Annotated[int, Field(ge=0, le=1_000_000)] = 50
    """Gather every rank's step time every this many optimizer steps (a one-number all-gather per rank); 0 turns detection off."""
    factor: Annotated[float, Field(ge=1.05, le=100)] = 1.5
    """A rank whose step time exceeds this many times the median of all ranks is slow."""
    window: Annotated[int, Field(ge=1, le=1000)] = 3
    """Consecutive comparisons a rank must be slow in before it is reported (a Warning Event and the Straggler condition, naming its pod and node)."""


class Storage(ApiModel):
    """A PersistentVolumeClaim shared by every worker and the engine Job (checkpoints, artifacts)."""

    claim_name: Annotated[str, Field(min_length=1, max_length=MAX_OBJECT_NAME)]
    """Name of a ReadWriteMany PersistentVolumeClaim in the job's namespace."""
    mount_path: Annotated[str, Field(pattern=r"^/", max_length=MAX_PATH_LENGTH)] = "/workspace"
    """Where the claim is mounted in the worker and engine containers."""


class CheckpointSettings(ApiModel):
    """Where and how often checkpoints are written. A gang restart resumes from the last one."""

    dir: Annotated[str, Field(pattern=r"^/", max_length=MAX_PATH_LENGTH)] = "/workspace/checkpoints"
    """Directory for checkpoints: it must survive a pod (a PVC, e.g. through spec.storage)."""
    every_n_steps: Annotated[int, Field(ge=1, le=INT32_MAX)] = 500
    """Save a checkpoint every this many optimizer steps (and always at the end)."""
    keep_last: Annotated[int, Field(ge=1, le=1000)] = 3
    """Keep this many step checkpoints besides last.ckpt."""


class ArtifactSettings(ApiModel):
    """Where the exported model and the engine go."""

    dir: Annotated[str, Field(pattern=r"^/", max_length=MAX_PATH_LENGTH)] = "/workspace/artifacts"
    """Directory for model.onnx, artifacts.json, the TensorRT engine and its report (a PVC that the engine Job mounts too)."""


class OnnxExport(ApiModel):
    """ONNX export by rank 0 at the end of training."""

    enabled: bool = True
    """Export model.onnx and check it with ONNX Runtime."""
    opset: Annotated[int, Field(ge=17, le=23)] = 17
    """ONNX opset version (17 or newer)."""
    dynamic_batch: bool = True
    """Make the batch axis dynamic, so that the engine can be built for a range of batch sizes."""
    input_shape: Optional[Annotated[list[Annotated[int, Field(ge=1, le=MAX_BATCH)]], Field(min_length=1, max_length=4)]] = None
    """Shape of one sample without the batch axis, e.g. [3, 224, 224], for a model without example_input_array (which is used first: a tensor, tuple or dict, dtypes kept). Default: the data module's sample_shape."""
    input_dtype: Literal["float32", "float16", "bfloat16", "int64", "int32", "bool"] = "float32"
    """Data type of the input given by inputShape, e.g. int64 for a text model's token ids."""


class ExportSettings(ApiModel):
    """Exports written at the end of training."""

    onnx: OnnxExport = Field(default_factory=OnnxExport)
    """ONNX export."""


EngineLayerPrecision = Literal["fp32", "fp16", "bf16"]
HardwareCompatibilityLevel = Literal["none", "ampere+", "same-compute-capability"]
PrecisionConstraints = Literal["none", "prefer", "obey"]
# An axis as long as 16 Mi elements: long enough for any sequence length a GPU holds.
MAX_AXIS_LENGTH = 2**24
ShapeList = Annotated[list[Annotated[int, Field(ge=1, le=MAX_AXIS_LENGTH)]], Field(min_length=1, max_length=8)]


class InputShapeRange(ApiModel):
    """The shapes one input takes in an optimisation profile (trtexec --minShapes/--optShapes/--maxShapes)."""

    min: ShapeList
    """Smallest shape, every axis, e.g. [1, 3, 224, 224]."""
    opt: ShapeList
    """Shape TensorRT tunes for."""
    max: ShapeList
    """Largest shape."""


class EngineProfile(ApiModel):
    """One optimisation profile: a shape range for each input with a dynamic axis."""

    inputs: Annotated[dict[Annotated[str, Field(max_length=MAX_OBJECT_NAME)], InputShapeRange], Field(min_length=1, max_length=MAX_MAP_ENTRIES)]
    """Shape ranges by input name."""


class EngineSettings(ApiModel):
    """The follow-up Job that builds a TensorRT engine from model.onnx."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": 'self.minBatch <= self.maxBatch && (!has(self.optBatch) || (self.minBatch <= self.optBatch && self.optBatch <= self.maxBatch))', "message": 'need minBatch <= optBatch <= maxBatch'},
    ]})

    enabled: bool = True
    """Build the engine after training succeeds."""
    image: Annotated[str, Field(min_length=1, max_length=MAX_IMAGE_LENGTH)] = contract.DEFAULT_ENGINE_IMAGE
    """A TensorRT-capable image with dtrain's `tensorrt` extra installed."""
    precision: EnginePrecision = "fp16"
    """Engine precision: fp32, fp16, bf16 or int8 (int8 needs a quantized ONNX model)."""
    min_batch: Annotated[int, Field(ge=1, le=MAX_BATCH)] = 1
    """Smallest batch size the engine accepts."""
    opt_batch: Optional[Annotated[int, Field(ge=1, le=MAX_BATCH)]] = None
    """Batch size TensorRT tunes for (default: maxBatch)."""
    max_batch: Annotated[int, Field(ge=1, le=MAX_BATCH)] = 32
    """Largest batch size the engine accepts."""
    workspace_mi_b: Annotated[int, Field(ge=16, le=1_048_576, alias="workspaceMiB")] = 4096
    """Builder workspace memory limit in MiB."""
    resources: Optional[Resources] = None
    """Resources of the engine container (default: one nvidia.com/gpu)."""
    backoff_limit: Annotated[int, Field(ge=0, le=100)] = 1
    """Retries of the engine Job before it is marked failed."""
    # The build options below are `dtrain build-engine` flags, with trtexec's defaults.
    profiles: Optional[Annotated[list[EngineProfile], Field(min_length=1, max_length=8)]] = None
    """Optimisation profiles with per-input min/opt/max shapes (trtexec --minShapes/--optShapes/--maxShapes, once per profile); when set, minBatch/optBatch/maxBatch are not used. Needed for a dynamic axis besides the batch axis."""
    tf32: bool = False
    """Let fp32 builds use TF32 (trtexec's default; off here, as in polygraphy, so fp32 meets its 1e-3 bound)."""
    hardware_compatibility_level: HardwareCompatibilityLevel = "none"
    """GPUs the engine must run on besides the builder's (trtexec --hardwareCompatibilityLevel, default none)."""
    version_compatible: bool = False
    """Build an engine that later TensorRT versions can run (trtexec --versionCompatible)."""
    refit: bool = False
    """Build a refittable engine, for pipelines that retrain (trtexec --refit)."""
    strip_weights: bool = False
    """Build a weight-stripped engine, refitted from model.onnx before use (trtexec --stripWeights)."""
    builder_optimization_level: Annotated[int, Field(ge=0, le=5)] = 3
    """Builder optimisation level 0-5: higher builds longer for a faster engine (trtexec --builderOptimizationLevel, default 3)."""
    layer_precisions: Optional[Annotated[dict[Annotated[str, Field(max_length=MAX_OBJECT_NAME)], EngineLayerPrecision], Field(max_length=MAX_MAP_ENTRIES)]] = None
    """Per-layer precision by layer name or * pattern (trtexec --layerPrecisions); weakly typed builds only."""
    precision_constraints: PrecisionConstraints = "none"
    """How strictly layerPrecisions hold (trtexec --precisionConstraints, default none; prefer when layerPrecisions is set)."""
    plugin_libraries: Optional[Annotated[list[Annotated[str, Field(pattern=r"^/", max_length=MAX_PATH_LENGTH)]], Field(max_length=16)]] = None
    """TensorRT plugin libraries to load, absolute paths in the engine image (trtexec --dynamicPlugins)."""
    use_cuda_graph: bool = False
    """Also time the engine through a CUDA graph (trtexec --useCudaGraph)."""

    @model_validator(mode="after")
    def _batch_order(self) -> "EngineSettings":
        opt = self.opt_batch if self.opt_batch is not None else self.max_batch
        if not self.min_batch <= opt <= self.max_batch:
            raise ValueError(
                f"need minBatch <= optBatch <= maxBatch, got {self.min_batch} <= {opt} <= {self.max_batch}"
            )
        return self

    @property
    def resolved_opt_batch(self) -> int:
        return self.opt_batch if self.opt_batch is not None else self.max_batch


class RunPolicy(ApiModel):
    """How failures, deadlines and cleanup are handled."""

    restart_policy: Literal["OnFailure", "ExitCode", "Never"] = "OnFailure"
    """OnFailure: any worker failure restarts the gang. ExitCode: exit codes 1-127 (a bug in the job) fail it at once, 128+ and evictions restart. Never: the first failure fails the job. Under every policy, the trainer's exit code 78 (a classPath, initArgs, checkpoint directory or model export that cannot work) fails the job at once with reason InvalidTrainerConfig."""
    backoff_limit: Annotated[int, Field(ge=0, le=1000)] = 3
    """Gang restarts allowed before the job fails with BackoffLimitExceeded."""
    active_deadline_seconds: Optional[Annotated[int, Field(ge=1, le=MAX_DURATION_SECONDS)]] = None
    """Fail the job (DeadlineExceeded) when it runs longer than this, counted from its start."""
    progress_deadline_seconds: Annotated[int, Field(ge=0, le=MAX_TIMEOUT_SECONDS)] = contract.DEFAULT_PROGRESS_DEADLINE_SECONDS
    """Restart the gang from its last checkpoint (reason ProgressDeadlineExceeded, counted against backoffLimit) when every worker runs but no training or validation batch completes for this many seconds: a rank stuck in a collective, a dead data loader. Time spent writing a checkpoint or exporting the model does not count. Make it longer than your slowest step, your first step after a start (data loading, compilation) and 15 s (how often rank 0 reports); well under nccl.timeoutSeconds, which it is meant to beat. 0 turns it off. Default 600."""
    ttl_seconds_after_finished: Optional[Annotated[int, Field(ge=0, le=MAX_DURATION_SECONDS)]] = None
    """Delete the DistributedTraining this long after it succeeded or failed (none: keep it)."""
    clean_pod_policy: Literal["Running", "All", "None"] = "Running"
    """Pods deleted when the job finishes: Running (those still running), All, or None (keep them for debugging)."""
    suspend: bool = False
    """True stops the job: worker pods are deleted; false starts them again and training resumes from its checkpoint."""


class GangScheduling(ApiModel):
    """All-or-nothing scheduling of the worker pods through a PodGroup."""

    enabled: bool = False
    """Create a PodGroup so that the scheduler places all workers or none (needs Volcano or the scheduler-plugins coscheduling plugin)."""
    min_available: Optional[Annotated[int, Field(ge=1, le=4096)]] = None
    """Workers that must be schedulable together (default: nodes)."""
    schedule_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] = 300
    """Report pods still Pending after this long, with their reason, in a condition."""


class SchedulingSettings(ApiModel):
    """Where and how the worker pods are scheduled."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": '!has(self.gang) || !self.gang.enabled || has(self.schedulerName)', "message": 'gang.enabled needs schedulerName: volcano, or the name of your scheduler-plugins scheduler'},
    ]})

    scheduler_name: Optional[Annotated[str, Field(min_length=1, max_length=MAX_OBJECT_NAME)]] = None
    """Scheduler of the worker pods, e.g. volcano or scheduler-plugins-scheduler. Gang scheduling picks the PodGroup kind from it."""
    priority_class_name: Optional[Annotated[str, Field(min_length=1, max_length=MAX_OBJECT_NAME)]] = None
    """PriorityClass of the worker pods."""
    node_selector: Annotated[
        dict[str, Annotated[str, Field(max_length=MAX_LABEL_VALUE_LENGTH)]], Field(max_length=MAX_MAP_ENTRIES)
    ] = Field(default_factory=dict)
    """Node labels the worker pods must match, e.g. {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}."""
    tolerations: Annotated[list[KubeObject], Field(max_length=64)] = Field(default_factory=list)
    """Tolerations of the worker pods (core/v1 Toleration)."""
    affinity: Optional[KubeObject] = None
    """Affinity of the worker pods (core/v1 Affinity)."""
    gang: GangScheduling = Field(default_factory=GangScheduling)
    """Gang scheduling."""

    @model_validator(mode="after")
    def _gang_needs_scheduler(self) -> "SchedulingSettings":
        if self.gang.enabled and not self.scheduler_name:
            raise ValueError(
                "gang.enabled needs schedulerName: volcano, or the name of your scheduler-plugins scheduler"
            )
        return self


class DistributedTrainingSpec(ApiModel):
    """What to train, on how many nodes, and what to build from it."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": '!has(self.scheduling) || !has(self.scheduling.gang) || !has(self.scheduling.gang.minAvailable) || self.scheduling.gang.minAvailable <= self.nodes', "message": 'scheduling.gang.minAvailable cannot exceed nodes'},
        {"rule": '(has(self.engine) && !self.engine.enabled) || !has(self.export) || !has(self.export.onnx) || self.export.onnx.enabled', "message": 'engine.enabled needs export.onnx.enabled: the engine is built from model.onnx'},
    ]})

    image: Annotated[str, Field(min_length=1, max_length=MAX_IMAGE_LENGTH)] = contract.DEFAULT_TRAINER_IMAGE
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
    gpu_memory: Optional[Annotated[str, Field(max_length=MAX_MEMORY_SIZE_LENGTH, pattern=MEMORY_SIZE_PATTERN)]] = None
    """Memory of one GPU of the nodes the job runs on, e.g. 32Gi or 80G (default: the nvidia.com/gpu.memory label, in MiB, where scheduling.nodeSelector names it). The operator compares it with the per-GPU memory estimate that `dtrain submit` records in the dtrain.dev/memory-estimate annotation: a batch that does not fit gets the GPUMemoryExceeded condition and a Warning Event at creation; nothing is refused."""
    resources: Optional[Resources] = None
    """CPU and memory of each worker container (GPUs come from devicesPerNode)."""
    env: Annotated[list[EnvVar], Field(max_length=256)] = Field(default_factory=list)
    """Extra environment variables of the trainer container."""
    volumes: Annotated[list[KubeObject], Field(max_length=64)] = Field(default_factory=list)
    """Extra volumes of the worker pods (core/v1 Volume), e.g. a PVC with the data set."""
    volume_mounts: Annotated[list[KubeObject], Field(max_length=64)] = Field(default_factory=list)
    """Extra volume mounts of the trainer container (core/v1 VolumeMount)."""
    host_network: bool = False
    """Run worker pods in the host's network namespace. Only some NCCL/RDMA setups need this; it weakens isolation."""
    service_account_name: Annotated[str, Field(min_length=1, max_length=MAX_OBJECT_NAME)] = contract.DEFAULT_WORKER_SERVICE_ACCOUNT
    """Service account of the worker pods: it needs `patch` on distributedtrainings/status to report progress."""
    master_port: Annotated[int, Field(ge=1024, le=65535)] = contract.DEFAULT_MASTER_PORT
    """Port of torchrun's rendezvous on node 0."""
    termination_grace_period_seconds: Annotated[int, Field(ge=15, le=86400)] = (
        contract.DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS
    )
    """Seconds a worker pod has after SIGTERM (preemption, a node drain, kubectl delete) before it is killed. In that time every rank stops at the next optimizer step and rank 0 saves a checkpoint, so that the restarted gang loses no work. Make it longer than writing one checkpoint of your model takes (minutes for a large model on network storage); the default is 600."""
    storage: Optional[Storage] = None
    """A shared PVC mounted in every worker and the engine Job, for checkpoints and artifacts."""
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

    @model_validator(mode="after")
    def _cross_field(self) -> "DistributedTrainingSpec":
        gang = self.scheduling.gang
        if gang.min_available is not None and gang.min_available > self.nodes:
            raise ValueError(
                f"scheduling.gang.minAvailable ({gang.min_available}) cannot exceed nodes ({self.nodes})"
            )
        if self.engine.enabled and not self.export.onnx.enabled:
            raise ValueError("engine.enabled needs export.onnx.enabled: the engine is built from model.onnx")
        return self

    @property
    def world_size(self) -> int:
        return self.nodes * self.devices_per_node


# --- The status -------------------------------------------------------------------


class StatusModel(ApiModel):
    """Status types tolerate fields they do not know: kopf and newer operators write there too."""

    model_config = ConfigDict(extra="allow")


class Condition(StatusModel):
    """A Kubernetes-style condition."""

    type: str
    """Condition type, e.g. Running, Restarting, Succeeded, Failed."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str = ""
    """One CamelCase word saying why, e.g. BackoffLimitExceeded."""
    message: str = ""
    """What happened, for a person."""
    last_transition_time: Optional[str] = None
    """When the status last changed (RFC 3339)."""


class NodeCounts(StatusModel):
    """Worker pods of the current gang by state."""

    total: int = 0
    """Worker pods the job has."""
    pending: int = 0
    """Pods waiting to be scheduled or to start."""
    running: int = 0
    """Pods running."""
    succeeded: int = 0
    """Pods that exited 0."""
    failed: int = 0
    """Pods that failed."""


class StepTimes(StatusModel):
    """Step times of all ranks at one comparison: the time a rank spends on a step before the gradient all-reduce (forward and loss), which waiting for the other ranks does not inflate."""

    step: Optional[int] = None
    """Global step of the comparison."""
    median_seconds: Optional[float] = None
    """Median over the ranks."""
    slowest_rank: Optional[int] = None
    """The slowest rank."""
    slowest_seconds: Optional[float] = None
    """Its step time."""
    slowest_pod: Optional[str] = None
    """Its pod."""
    slowest_node: Optional[str] = None
    """Its Kubernetes node."""
    ratio: Optional[float] = None
    """slowestSeconds / medianSeconds."""
    slow_checks: Optional[int] = None
    """Consecutive comparisons this rank was slower than spec.stragglers.factor times the median."""
    straggler: Optional[bool] = None
    """True once slowChecks reaches spec.stragglers.window: the rank is reported as a straggler."""


class Progress(StatusModel):
    """Training progress, reported by rank 0."""

    epoch: Optional[int] = None
    """Current epoch (from 0)."""
    step: Optional[int] = None
    """Global optimizer step."""
    loss: Optional[float] = None
    """Latest training loss."""
    images_per_second: Optional[float] = None
    """Training throughput over all ranks (warm-up excluded)."""
    updated_at: Optional[str] = None
    """When this was reported (RFC 3339)."""
    step_times: Optional["StepTimes"] = None
    """Every rank's step time at the latest comparison (spec.stragglers), and the slowest rank."""
    stage: Optional[str] = None
    """What rank 0 is doing: training, validating, checkpointing (writing a checkpoint), or exporting (the model is being exported to ONNX)."""
    metrics: Optional[dict[str, float]] = None
    """The latest value of val_loss, val_acc, each metric logged with prog_bar=True and each of spec.logging.metrics."""
    validation: Optional[str] = None
    """The first validation metric as name=value, e.g. val_loss=0.412 (the VAL column)."""
    batches: Optional[int] = None
    """Training and validation batches rank 0 has completed since its process started: only the training and validation loops advance it (runPolicy.progressDeadlineSeconds watches it)."""
    batch_time: Optional[str] = None
    """When rank 0 completed the latest of those batches (RFC 3339)."""


class PreflightRank(StatusModel):
    """Where one rank ran."""

    rank: Optional[int] = None
    """Global rank."""
    pod: Optional[str] = None
    """Its pod."""
    node: Optional[str] = None
    """Its Kubernetes node."""


class Preflight(StatusModel):
    """The pre-flight gang check of the current gang, reported by rank 0 before training (nccl.preflightTimeoutSeconds)."""

    backend: Optional[str] = None
    """gloo (CPU) or nccl (GPU)."""
    world_size: Optional[int] = None
    """Ranks that joined."""
    seconds: Optional[float] = None
    """What the whole check cost this start, in seconds."""
    join_seconds: Optional[float] = None
    """Until every rank had joined."""
    all_reduce_bytes: Optional[int] = None
    """Size of the timed all-reduce."""
    all_reduce_ms: Optional[float] = None
    """Median time of that all-reduce, in milliseconds."""
    latency_ms: Optional[float] = None
    """Median time of a one-element all-reduce, in milliseconds."""
    bus_bandwidth_g_bps: Annotated[Optional[float], Field(alias="busBandwidthGBps")] = None
    """Bus bandwidth of the all-reduce in GB/s, as nccl-tests reports it (2(n-1)/n times size / time)."""
    versions: Optional[dict[str, Optional[str]]] = None
    """torch, CUDA and NCCL versions, the same on every rank."""
    ranks: Optional[list[PreflightRank]] = None
    """Each rank's pod and node."""
    time: Optional[str] = None
    """When the check ran (RFC 3339)."""


class CheckpointInfo(StatusModel):
    """The newest checkpoint."""

    step: Optional[int] = None
    """Global step of the checkpoint."""
    path: Optional[str] = None
    """Path of the checkpoint file."""
    time: Optional[str] = None
    """When it was written (RFC 3339)."""


class DistributedTrainingStatus(StatusModel):
    """Observed state, computed by the operator (progress and lastCheckpoint by rank 0)."""

    phase: Optional[Phase] = None
    """Pending, Starting, Running, Restarting, Exporting, BuildingEngine, Succeeded, Failed or Suspended."""
    conditions: list[Condition] = Field(default_factory=list)
    """Conditions: Created, Running, Restarting, TrainingSucceeded, EngineBuilt, Succeeded, Failed, Suspended, ..."""
    nodes: Optional[NodeCounts] = None
    """Worker pods of the current gang by state."""
    nodes_ready: Optional[str] = None
    """Running worker pods out of all, e.g. 3/4 (the NODES column)."""
    restarts: int = 0
    """Gang restarts so far."""
    start_time: Optional[str] = None
    """When the job started (RFC 3339)."""
    completion_time: Optional[str] = None
    """When the job finished (RFC 3339)."""
    progress: Optional[Progress] = None
    """Training progress."""
    last_checkpoint: Optional[CheckpointInfo] = None
    """The newest checkpoint."""
    preflight: Optional[Preflight] = None
    """The pre-flight gang check of the latest gang start: all-reduce latency and bus bandwidth."""
    artifacts: Optional[InitArgs] = None
    """What training and the engine Job produced: ONNX file, parity error, engine, latency report."""
    observed_generation: Optional[int] = None
    """The spec generation this status describes."""
    accepted_spec: Optional[InitArgs] = None
    """The spec the job was created with (defaults filled in). The operator runs this spec; later changes to immutable fields are reported in the SpecImmutable condition, not applied."""


# --- The object -------------------------------------------------------------------


class ObjectMeta(StatusModel):
    """Standard object metadata; only the name is checked here."""

    name: Annotated[str, Field(max_length=MAX_NAME_LENGTH, pattern=DNS1035_PATTERN)]
    """Name of the job: lowercase letters, digits and '-', starting with a letter, at most 45 characters."""
    namespace: Optional[str] = None
    """Namespace of the job."""


class DistributedTraining(ApiModel):
    """Multi-node PyTorch Lightning DDP training, restarted as a gang from its last checkpoint, then a TensorRT engine."""

    api_version: Literal["dtrain.dev/v1alpha1"] = contract.API_VERSION
    """dtrain.dev/v1alpha1"""
    kind: Literal["DistributedTraining"] = contract.KIND
    """DistributedTraining"""
    metadata: ObjectMeta
    """Standard object metadata."""
    spec: DistributedTrainingSpec = Field(default_factory=DistributedTrainingSpec)
    """What to train, on how many nodes, and what to build from it."""
    status: Optional[DistributedTrainingStatus] = None
    """Observed state."""

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"


class TrainerConfig(ApiModel):
    """What the trainer reads from DTRAIN_CONFIG: the resolved sections of the spec it needs.

    The operator writes it into the job's ConfigMap and `dtrain run` into the workdir;
    nodes and devicesPerNode are there so that the trainer can check them against
    torchrun's environment and fail loudly on a mismatch.
    """

    job_name: str
    """Name of the DistributedTraining."""
    accelerator: Literal["gpu", "cpu"] = "gpu"
    """gpu or cpu."""
    nodes: Annotated[int, Field(ge=1)] = 1
    """Number of nodes (must equal PET_NNODES)."""
    devices_per_node: Annotated[int, Field(ge=1)] = 1
    """Processes per node (must equal PET_NPROC_PER_NODE)."""
    model: ClassSpec = Field(default_factory=lambda: ClassSpec(class_path=BUILTIN_MODEL))
    """The LightningModule."""
    data: ClassSpec = Field(default_factory=lambda: ClassSpec(class_path=BUILTIN_SYNTHETIC_DATA))
    """The LightningDataModule."""
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    """Trainer settings."""
    nccl: NcclSettings = Field(default_factory=NcclSettings)
    """NCCL settings (the trainer uses timeoutSeconds)."""
    stragglers: StragglerSettings = Field(default_factory=StragglerSettings)
    """Straggler detection."""
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    """Checkpoints."""
    artifacts: ArtifactSettings = Field(default_factory=ArtifactSettings)
    """Artifacts."""
    export: ExportSettings = Field(default_factory=ExportSettings)
    """Exports."""
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    """The logger and the reported metrics."""

    @classmethod
    def from_job(cls, job: DistributedTraining) -> "TrainerConfig":
        spec = job.spec
        return cls(
            job_name=job.name,
            accelerator=spec.accelerator,
            nodes=spec.nodes,
            devices_per_node=spec.devices_per_node,
            model=spec.model,
            data=spec.data,
            trainer=spec.trainer,
            nccl=spec.nccl,
            stragglers=spec.stragglers,
            checkpoint=spec.checkpoint,
            artifacts=spec.artifacts,
            export=spec.export,
            logging=spec.logging,
        )


# runPolicy fields that may change after creation; every other spec field is immutable.
MUTABLE_RUN_POLICY_FIELDS = ("suspend", "ttlSecondsAfterFinished")


# The accepted copy of a spec (status.acceptedSpec, the operator's state annotation) is read by
# whoever may view the job, so env values stay in the spec itself: the copy holds this instead.
# The API server's immutability rule keeps them equal to the accepted ones.
ENV_VALUE_PLACEHOLDER = "(in spec.env)"


def immutable_spec(spec: DistributedTrainingSpec) -> dict[str, Any]:
    """The part of a spec (defaults filled in) that may not change once the job exists, env values left out."""
    wire = spec.to_wire()
    wire["runPolicy"] = {k: v for k, v in wire["runPolicy"].items() if k not in MUTABLE_RUN_POLICY_FIELDS}
    for var in wire.get("env", []):
        if "value" in var:
            var["value"] = ENV_VALUE_PLACEHOLDER
    return wire


def with_env_values(accepted: DistributedTrainingSpec, env: list[EnvVar]) -> DistributedTrainingSpec:
    """An accepted spec with its env values taken, by name, from the job's own `env`."""
    by_name = {var.name: var for var in env}
    if any(var.value == ENV_VALUE_PLACEHOLDER and var.name not in by_name for var in accepted.env):
        # A variable renamed by an edit the API server should have refused: the user's list, as written.
        return accepted.model_copy(update={"env": list(env)})
    restored = [by_name[var.name] if var.value == ENV_VALUE_PLACEHOLDER else var for var in accepted.env]
    return accepted.model_copy(update={"env": restored})
