"""The DistributedTraining object, the trainer's config made from it, and the part of a spec that may not change."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Field

from dtrain_operator.api import contract, job_dirs, storage
from dtrain_operator.api.artifacts import ArtifactSettings, ExportSettings
from dtrain_operator.api.builtin_classes import BUILTIN_MODEL, BUILTIN_SYNTHETIC_DATA
from dtrain_operator.api.common import DNS1035_PATTERN, MAX_NAME_LENGTH, ApiModel, EnvVar
from dtrain_operator.api.spec import (
    CheckpointSettings,
    ClassSpec,
    CollectiveTimeouts,
    DistributedTrainingSpec,
    LoggingSettings,
    StragglerSettings,
    TrainerSettings,
)
from dtrain_operator.api.status import DistributedTrainingStatus, StatusModel


class ObjectMeta(StatusModel):
    """Standard object metadata: the name as dtrain needs it; the rest is the API server's to judge."""

    name: Annotated[str, Field(max_length=MAX_NAME_LENGTH, pattern=DNS1035_PATTERN)]
    """Name of the job: lowercase letters, digits and '-', starting with a letter, at most 45 characters."""
    namespace: str | None = None
    """Namespace of the job."""
    uid: str | None = None
    """Set by the API server: tells a job from an earlier one of the same name (checkpoints record it)."""
    labels: dict[str, str] | None = None
    """The job's labels: kueue.x-k8s.io/queue-name queues it in Kueue (docs/cluster.md)."""


class DistributedTraining(ApiModel):
    """Multi-node PyTorch Lightning DDP training, restarted as a gang from its last checkpoint, then a TensorRT engine."""

    api_version: Literal["dtrain.dev/v1alpha1"] = contract.API_VERSION
    """dtrain.dev/v1alpha1"""
    kind: Literal["DistributedTraining"] = contract.KIND
    """DistributedTraining"""
    metadata: ObjectMeta
    """Standard object metadata."""
    spec: DistributedTrainingSpec
    """What to train, on how many nodes, and what to build from it."""
    status: DistributedTrainingStatus | None = None
    """Observed state."""

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"


class TrainerConfig(ApiModel):
    """What the trainer reads from DTRAIN_CONFIG: the resolved sections of the spec it needs.

    The operator writes it into each worker pod (an annotation, mounted as a file) and `dtrain run` into the workdir. The gang's
    shape is not in it: it reaches the trainer only through torchrun's environment
    (core.launch_env), so that the two cannot disagree.
    """

    job_name: str
    """Name of the DistributedTraining."""
    job_namespace: str = "default"
    """Its namespace: with the name and uid, the owner every checkpoint records."""
    job_uid: str | None = None
    """Its uid (none under `dtrain run`)."""
    accelerator: Literal["gpu", "cpu"] = "gpu"
    """gpu or cpu."""
    model: ClassSpec = Field(default_factory=lambda: ClassSpec(class_path=BUILTIN_MODEL))
    """The LightningModule."""
    data: ClassSpec = Field(default_factory=lambda: ClassSpec(class_path=BUILTIN_SYNTHETIC_DATA))
    """The LightningDataModule."""
    trainer: TrainerSettings = Field(default_factory=TrainerSettings)
    """Trainer settings."""
    nccl: CollectiveTimeouts = Field(default_factory=CollectiveTimeouts)
    """The collectives' timeouts (NCCL's own settings reach it as NCCL_* variables)."""
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
    progress_deadline_seconds: int = contract.DEFAULT_PROGRESS_DEADLINE_SECONDS
    """runPolicy.progressDeadlineSeconds: rank 0 collects every rank's stacks shortly before it runs out (0: never)."""
    elastic_nodes: Annotated[int, Field(ge=1)] | None = None
    """The gang size trainer.batchSize and accumulateGradBatches are for, when the gang is elastic: on any other
    size the trainer keeps their global batch and the epoch's sample order (api.elastic). None: a fixed gang."""

    @property
    def checkpoint_dir(self) -> str:
        """checkpoint.dir, or the per-job default on the pod's disk when the config leaves it out."""
        return self.checkpoint.dir or storage.job_dir(
            storage.POD_LOCAL_ROOT, self.job_namespace, self.job_name, storage.CHECKPOINTS_LEAF
        )

    @property
    def artifacts_dir(self) -> str:
        """artifacts.dir, or the per-job default on the pod's disk when the config leaves it out."""
        return self.artifacts.dir or storage.job_dir(
            storage.POD_LOCAL_ROOT, self.job_namespace, self.job_name, storage.ARTIFACTS_LEAF
        )

    @classmethod
    def from_job(cls, job: DistributedTraining) -> TrainerConfig:
        spec = job.spec
        # The per-job default directories, resolved here: the trainer and the engine Job read the same ones.
        dirs = job_dirs.checkpoint_dir(spec, job.namespace, job.name), job_dirs.artifacts_dir(spec, job.namespace, job.name)
        return cls(
            job_name=job.name,
            job_namespace=job.namespace,
            job_uid=job.metadata.uid,
            accelerator=spec.accelerator,
            model=spec.model,
            data=spec.data,
            trainer=spec.trainer,
            nccl=CollectiveTimeouts.model_validate(spec.nccl.model_dump(include=set(CollectiveTimeouts.model_fields))),
            stragglers=spec.stragglers,
            checkpoint=spec.checkpoint.model_copy(update={"dir": dirs[0]}),
            artifacts=spec.artifacts.model_copy(update={"dir": dirs[1]}),
            export=spec.export,
            logging=spec.logging,
            progress_deadline_seconds=spec.run_policy.progress_deadline_seconds,
            elastic_nodes=spec.nodes if spec.elastic is not None else None,
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


def spec_hash(spec: Mapping[str, Any]) -> str:
    """The SHA-256 of a spec in canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


# Trainer settings that say how long to train or how often to log, not what a step computes: a run resumed
# with more epochs continues the same training.
_NOT_SHAPING = ("maxEpochs", "maxSteps", "logEveryNSteps")
# An elastic gang's per-process batch and accumulation change with its size (api.elastic): what shapes its
# training is their global batch, which the trainer checks against the one each checkpoint records.
_ELASTIC_LAYOUT = ("batchSize", "accumulateGradBatches")


def training_hash(config: TrainerConfig) -> str:
    """A hash of what shapes the training: the model, the data and the trainer settings (not its length)."""
    not_shaping = _NOT_SHAPING + (_ELASTIC_LAYOUT if config.elastic_nodes is not None else ())
    trainer = {k: v for k, v in config.trainer.to_wire().items() if k not in not_shaping}
    shaping: dict[str, Any] = {"model": config.model.to_wire(), "data": config.data.to_wire(), "trainer": trainer}
    canonical = json.dumps(shaping, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:32]
