"""The progress records rank 0's trainer writes and the operator and `dtrain run` read, typed.

The trainer's ProgressReporter (dtrain_trainer.progress) builds each record from its model here
(strict: a field the record does not have, or a value of the wrong type, is refused) and hands
its wire form to the sink: one JSON object per line for `jsonl:<path>`, the status patch of
`status_patch` for `kubernetes`. Readers (`dtrain run`'s display, summary and progress deadline)
read records with `read_record`, which is tolerant.

JSONL record format (every record has `event` and `time`, an RFC 3339 UTC timestamp;
fields that are not known yet are null; consumers must ignore fields they do not know):

    {"event": "start", "time": ..., "jobName": "quickstart", "worldSize": 2, "nodes": 2,
     "devicesPerNode": 1, "accelerator": "cpu", "precision": "32-true",
     "clusterEnvironment": "TorchElasticEnvironment", "maxSteps": -1, "maxEpochs": 2,
     "resumeFrom": "/ckpt/last.ckpt" | null,
     "lightning": "lightning.pytorch" | "pytorch_lightning"}   (the package the job trains with)
    {"event": "warning", "time": ..., "message": "precision 16-mixed needs a CUDA GPU ..."}
    {"event": "resumed", "time": ..., "path": "/ckpt/last.ckpt", "step": 40, "epoch": 1,
     "survivor": {"rank": 0, "step": 40, "error": "Connection closed by peer ..."} | null}
     (survivor: the checkpoint was written by a rank that outlived a lost peer, see dtrain_trainer.survivor)
    {"event": "progress", "time": ..., "epoch": 0, "step": 12, "totalSteps": 128 | null,
     "loss": 2.301, "imagesPerSecond": 812.5 | null, "epochEnd": false,
     "stage": "training" | "validating" | "checkpointing" | "exporting" | "finishing",
     "metrics": {"val_loss": 0.41, "val_acc": 0.87, ...}, "validation": "val_loss=0.41" | null,
     "batches": 512, "batchTime": ...,
     "stepTimes": {"step": 150, "medianSeconds": 0.09, "slowestRank": 1, "slowestSeconds": 0.31,
                   "slowestPod": "job-1", "slowestNode": "node-b", "ratio": 3.4, "slowChecks": 3,
                   "straggler": true} | null,
     "stepBreakdown": {"step": 150, "worldSize": 2, "ranks": [{"rank": 1, "dataWait": 0.21, "forward": 0.09,
                       "backward": 0.15, "allReduce": 0.01, "optimizer": 0.02}, ...],
                       "bottleneck": "rank 1: 44 % of its step waits on the data loader; trainer.numWorkers 0"} | null}
     (metrics: val_loss, val_acc, prog_bar and spec.logging.metrics; stepTimes: see dtrain_trainer.stragglers;
     stepBreakdown: dtrain_trainer.step_breakdown)   (the last progress record, before the export, says exporting)
    {"event": "checkpoint", "time": ..., "step": 20, "path": "/ckpt/step=00000020.ckpt", "ok": true}
    {"event": "checkpoint", "time": ..., "step": 20, "path": "s3://b/p/step=00000020.ckpt", "ok": true,
     "bytes": 104857600, "uploadSeconds": 1.9, "attempts": 1}   (object storage: the upload's size and time)
    {"event": "checkpoint", "time": ..., "step": 30, "path": "s3://b/p/step=00000030.ckpt", "ok": false,
     "error": "EndpointConnectionError: ...", "attempts": 5}   (not saved after retries; training went on)
    {"event": "checkpoint", "time": ..., "step": 41, "path": "/ckpt/step=00000041.ckpt", "ok": true,
     "survivor": {"rank": 0, "step": 41, "error": "..."}}   (written by rank 0 after a peer was lost)
    {"event": "export", "time": ..., "ok": true, "onnx": "/art/model.onnx",
     "parityError": 2.1e-07, "tolerance": 0.001, "artifacts": "/art/artifacts.json", "error": null}
    {"event": "finished", "time": ..., "ok": true, "step": 128, "epoch": 1, "loss": 0.41,
     "imagesPerSecond": 815.0, "exportError": "torch.onnx.export failed ..." (only when the export failed)}
    {"event": "stopped", "time": ..., "signal": "SIGTERM", "checkpoint": "/ckpt/last.ckpt", "step": 57,
     "epoch": 0, "loss": 0.9, "imagesPerSecond": 810.2}   (SIGTERM: every rank stopped after this step)
    {"event": "error", "time": ..., "message": "model.classPath: cannot import 'mypkg' ..."}
    {"event": "preflight", "time": ..., "backend": "gloo", "worldSize": 2, "seconds": 0.12,
     "joinSeconds": 0.01, "allReduceBytes": 4194304, "allReduceMs": 9.4, "latencyMs": 0.09,
     "busBandwidthGBps": 0.45, "versions": {...}, "ranks": [...]}   (see dtrain_trainer.preflight)
    {"event": "hang", "time": ..., "step": 57, "batches": 114, "stalledSeconds": 10.2, "worldSize": 4,
     "groups": [{"ranks": "0,2-3", "threads": 3, "frames": [{"module": "torch.autograd.graph",
                 "function": "_engine_run_backward", "file": "graph.py", "line": 841}, ...],
                 "code": [{"module": "dtrain_trainer.runner", ...}]}, ...],
     "silent": "1" | null, "dumps": "/art/hangs/20250101T120000Z-step-57"}
         (every rank's stacks when rank 0 completed no batch for a while, see dtrain_trainer.hang_watch)

`batches` counts the training and validation batches rank 0 has completed in this process, and
`batchTime` is when the latest completed: only the training and validation loops advance them (the
operator's progress deadline watches them, see dtrain_operator.core.progress_deadline). A record with
stage `checkpointing` is sent when a checkpoint starts to be written (the deadline holds meanwhile),
one with stage `validating` during validation, at the same rate as training's.

`step` is Lightning's global step (optimizer steps; with gradient accumulation one step
is several batches). `totalSteps` is the number of optimizer steps the run will take
when that is known. `loss` is rank 0's training loss as the model computed it (what it
logs as train_loss), averaged over the batches of the latest optimizer step (all
accumulateGradBatches of them), not Lightning's loss divided by accumulateGradBatches. `imagesPerSecond` counts
the images of all ranks (the batch of each rank times the world size), excluding the
first WARMUP_BATCHES (dtrain_trainer.progress_callback) batches of each process and the time between epochs (validation).

Reading is tolerant, as it always was: a line that is no JSON object, or names no event this
module knows, is skipped; fields a record does not have are ignored; a field of the wrong type
is read as absent, the rest of the record stays.
"""

from __future__ import annotations

# layout: a hundred lines of it are the record format's reference (the docstring), which belongs beside the records.
from collections.abc import Mapping
from enum import Enum
from typing import Annotated, Any, ClassVar, TypeVar, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic.alias_generators import to_camel
from typing_extensions import Self

from dtrain_operator.api import PreflightRank, StackGroup, StepBreakdown, StepTimes, SurvivorMark
from dtrain_operator.api.status import MAX_REPORTED_METRICS as MAX_METRICS
from dtrain_operator.api.status import MAX_REPORTED_RANKS, MAX_REPORTED_STACK_GROUPS, MAX_REPORTED_VERSIONS


class Event(str, Enum):
    """The `event` of a progress record: the one place its strings are spelled."""

    START = "start"
    WARNING = "warning"
    RESUMED = "resumed"
    PROGRESS = "progress"
    CHECKPOINT = "checkpoint"
    EXPORT = "export"
    FINISHED = "finished"
    STOPPED = "stopped"
    ERROR = "error"
    PREFLIGHT = "preflight"
    HANG = "hang"


class WireRecord(BaseModel):
    """A JSON object one process writes and another reads: strict when built, tolerant when read (`read`)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        # int is not bool and str is not int, as the readers' isinstance checks always held.
        strict=True,
        # JSON has no infinity or NaN.
        allow_inf_nan=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The fields the writer set, by their wire names (null where it set None)."""
        return self.model_dump(by_alias=True, exclude_unset=True)

    @classmethod
    def read(cls, data: Any) -> Self | None:
        """`data` as this record: unknown fields ignored (in nested parts too), a field of the wrong type read
        as absent (a list or object holding one, the whole of it); None when it is no JSON object."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls.model_validate(data, context=_READING)
        except ValidationError as error:
            wrong = {problem["loc"][0] for problem in error.errors() if problem["loc"]}
        try:
            return cls.model_validate({k: v for k, v in data.items() if k not in wrong}, context=_READING)
        except ValidationError:
            return None

    @model_validator(mode="before")
    @classmethod
    def _ignore_unknown_fields_when_reading(cls, data: Any, info: ValidationInfo) -> Any:
        if not (info.context or {}).get(READING) or not isinstance(data, Mapping):
            return data
        known = {field.alias or name for name, field in cls.model_fields.items()}
        return {key: value for key, value in data.items() if key in known}


# The key of the validation context of a reader (WireRecord.read): writers validate without it.
READING = "reading"
_READING = {READING: True}
RecordT = TypeVar("RecordT", bound=WireRecord)


# Every field a worker sends has a bound: what rank 0 reports is the job's own code's word (the report endpoint
# refuses a record over one with 413), and the status the operator writes from it must stay small.
MAX_TEXT = 2048
MAX_PATH = 4096
MAX_NAME = 253
MAX_WORD = 64
# A name a person reads in `dtrain get` and in Prometheus: printable, no control characters.
PRINTABLE_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"

Text = Annotated[str, Field(max_length=MAX_TEXT)]
PathText = Annotated[str, Field(max_length=MAX_PATH)]
Name = Annotated[str, Field(max_length=MAX_NAME)]
Word = Annotated[str, Field(max_length=MAX_WORD, pattern=PRINTABLE_PATTERN)]
MetricName = Annotated[str, Field(min_length=1, max_length=128, pattern=PRINTABLE_PATTERN)]


def _numbers_only(value: Any) -> Any:
    """Reported metrics are numbers; an entry that is not one is left out (a reader never fails on it)."""
    if not isinstance(value, Mapping):
        return value
    return {name: number for name, number in value.items()
            if isinstance(number, (int, float)) and not isinstance(number, bool)}


Metrics = Annotated[dict[MetricName, float], BeforeValidator(_numbers_only), Field(max_length=MAX_METRICS)]


class TrainerRecord(WireRecord):
    """What every progress record has: its event (a class attribute, written first) and when it was sent."""

    EVENT: ClassVar[Event]

    time: Word | None = None
    """RFC 3339 UTC; the trainer always sets it."""

    def to_wire(self) -> dict[str, Any]:
        return {"event": self.EVENT.value, **super().to_wire()}


class StartRecord(TrainerRecord):
    EVENT = Event.START

    job_name: Name | None = None
    world_size: int | None = None
    nodes: int | None = None
    devices_per_node: int | None = None
    accelerator: Word | None = None
    precision: Word | None = None
    cluster_environment: Word | None = None
    max_steps: int | None = None
    max_epochs: int | None = None
    resume_from: PathText | None = None
    lightning: Word | None = None


class WarningRecord(TrainerRecord):
    EVENT = Event.WARNING

    message: Text | None = None


class ErrorRecord(TrainerRecord):
    EVENT = Event.ERROR

    message: Text | None = None


class ResumedRecord(TrainerRecord):
    EVENT = Event.RESUMED

    path: PathText | None = None
    step: int | None = None
    epoch: int | None = None
    survivor: SurvivorMark | None = None
    """Set when a rank that outlived a lost peer wrote the checkpoint (its mark)."""


class CheckpointRecord(TrainerRecord):
    EVENT = Event.CHECKPOINT

    step: int | None = None
    path: PathText | None = None
    ok: bool | None = None
    """False: the checkpoint could not be written (object storage, after retries); training went on."""
    error: Text | None = None
    bytes: int | None = None
    upload_seconds: float | None = None
    """On object storage: how long the streamed upload took, retries included."""
    attempts: int | None = None
    survivor: SurvivorMark | None = None
    """Set when a rank that outlived a lost peer wrote it, just before it exited."""


class ExportRecord(TrainerRecord):
    EVENT = Event.EXPORT

    ok: bool | None = None
    onnx: PathText | None = None
    sha256: Word | None = None
    parity_error: float | None = None
    tolerance: float | None = None
    artifacts: PathText | None = None
    error: Text | None = None


class TrainingState(TrainerRecord):
    """Where training stands: what progress, finished and stopped records share."""

    epoch: int | None = None
    step: int | None = None
    loss: float | None = None
    images_per_second: float | None = None
    metrics: Metrics | None = None
    validation: Annotated[str, Field(max_length=256, pattern=PRINTABLE_PATTERN)] | None = None


class ProgressRecord(TrainingState):
    EVENT = Event.PROGRESS

    total_steps: int | None = None
    epoch_end: bool | None = None
    stage: Word | None = None
    batches: int | None = None
    batch_time: Word | None = None
    step_times: StepTimes | None = None
    step_breakdown: StepBreakdown | None = None


class FinishedRecord(TrainingState):
    EVENT = Event.FINISHED

    ok: bool | None = None
    export_error: Text | None = None


class StoppedRecord(TrainingState):
    EVENT = Event.STOPPED

    signal: Word | None = None
    checkpoint: PathText | None = None


class PreflightRecord(TrainerRecord):
    """The pre-flight gang check (dtrain_trainer.preflight); status.preflight holds the same fields."""

    EVENT = Event.PREFLIGHT

    backend: Word | None = None
    world_size: int | None = None
    seconds: float | None = None
    join_seconds: float | None = None
    all_reduce_bytes: int | None = None
    all_reduce_ms: float | None = None
    latency_ms: float | None = None
    bus_bandwidth_g_bps: Annotated[float | None, Field(alias="busBandwidthGBps")] = None
    versions: Annotated[dict[Word, Annotated[str, Field(max_length=MAX_NAME)] | None], Field(max_length=MAX_REPORTED_VERSIONS)] | None = None
    ranks: Annotated[list[PreflightRank], Field(max_length=MAX_REPORTED_RANKS)] | None = None


class HangRecord(TrainerRecord):
    """Every rank's Python stack when the gang stopped completing batches (dtrain_trainer.hang_watch); status.hangStacks
    holds the same fields."""

    EVENT = Event.HANG

    step: int | None = None
    batches: int | None = None
    stalled_seconds: float | None = None
    world_size: int | None = None
    groups: Annotated[list[StackGroup], Field(max_length=MAX_REPORTED_STACK_GROUPS)] | None = None
    silent: Text | None = None
    dumps: PathText | None = None


AnyTrainerRecord = (
    StartRecord | WarningRecord | ErrorRecord | ResumedRecord | CheckpointRecord | ExportRecord
    | ProgressRecord | FinishedRecord | StoppedRecord | PreflightRecord | HangRecord
)
RECORD_TYPES: dict[Event, type[TrainerRecord]] = {record.EVENT: record for record in get_args(AnyTrainerRecord)}


def build_record(event: Event, **fields: Any) -> TrainerRecord:
    """The record of `event` with `fields` (wire or Python names), strictly: an unknown field or a value of the
    wrong type raises pydantic's ValidationError, naming it."""
    return RECORD_TYPES[event](**fields)


def _record_type(data: Any) -> type[TrainerRecord] | None:
    """The record type of a JSON object of the trainer's; None when it is none (no object, an unknown event)."""
    if not isinstance(data, Mapping):
        return None
    try:
        return RECORD_TYPES[Event(data.get("event"))]
    except ValueError:
        return None


def read_record(data: Any) -> AnyTrainerRecord | None:
    """One JSON object of the trainer's as its record; None when it is none (no object, an unknown event)."""
    record_type = _record_type(data)
    return None if record_type is None else record_type.read(data)  # type: ignore[return-value]


def checked_record(data: Any) -> AnyTrainerRecord | None:
    """A record as the report endpoint takes it from a worker: fields it does not know are ignored, but a field of
    the wrong type or over its bound raises pydantic's ValidationError; None for no record (no object, an unknown
    event)."""
    record_type = _record_type(data)
    return None if record_type is None else record_type.model_validate(data, context=_READING)  # type: ignore[return-value]


def _as_sent(part: BaseModel | None) -> dict[str, Any] | None:
    return None if part is None else part.model_dump(by_alias=True, exclude_unset=True, mode="json")


def status_patch(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The part of DistributedTraining.status a record updates (merge-patch shape), if any."""
    record = read_record(data)
    if isinstance(record, ProgressRecord):
        fields = {
            "epoch": record.epoch,
            "step": record.step,
            # Lets `dtrain get` and `dtrain watch` show an ETA.
            "totalSteps": record.total_steps,
            "loss": record.loss,
            "imagesPerSecond": record.images_per_second,
            "stage": record.stage,
            "metrics": record.metrics or None,
            "validation": record.validation,
            "batches": record.batches,
            "batchTime": record.batch_time,
            # As sent: a null in them clears that field of the status.
            "stepTimes": _as_sent(record.step_times),
            "stepBreakdown": _as_sent(record.step_breakdown),
            "updatedAt": record.time,
        }
        # null in a merge patch deletes a field: leave out what is not known yet instead.
        return {"progress": {k: v for k, v in fields.items() if v is not None}}
    if isinstance(record, PreflightRecord):
        return {"preflight": {k: v for k, v in record.to_wire().items() if k != "event" and v is not None}}
    if isinstance(record, HangRecord):
        # Every field, null included: a merge patch would keep an earlier collection's silent ranks otherwise.
        wire = record.model_dump(by_alias=True, mode="json", exclude_none=True)
        return {"hangStacks": {field.alias or name: wire.get(field.alias or name) for name, field in HangRecord.model_fields.items()}}
    if isinstance(record, CheckpointRecord) and record.ok is False:
        # The newest whole checkpoint stays; the miss is said beside it (the CheckpointMissed condition).
        missed = {"step": record.step, "path": record.path, "error": record.error, "time": record.time}
        return {"lastCheckpoint": {"missed": {k: v for k, v in missed.items() if v is not None}}}
    if isinstance(record, CheckpointRecord):
        # null clears a miss that an earlier record reported: this checkpoint is written.
        return {"lastCheckpoint": {"step": record.step, "path": record.path, "time": record.time, "missed": None}}
    return None
