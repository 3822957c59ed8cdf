"""`status`: what the operator observed and decided; status types tolerate fields they do not know."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from dtrain_operator.api.common import ApiModel, InitArgs, Phase
from dtrain_operator.api.failure_rules import RestartStrategy

# What rank 0 reports is bounded (api.records: the report endpoint refuses more); the CRD says the same of the status.
MAX_REPORTED_METRICS = 64
MAX_REPORTED_VERSIONS = 32
MAX_REPORTED_RANKS = 1024
MAX_REPORTED_STACK_GROUPS = 64
# The slowest ranks and the median one: a 256-rank job reports as many rows as a 4-rank one.
MAX_BREAKDOWN_RANKS = 4
MAX_BOTTLENECK_CHARS = 256


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
    last_transition_time: str | None = None
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
    """Step times of all ranks at one comparison: the time a rank spends on a step before the gradient all-reduce (forward and loss), which waiting for the other ranks does not inflate; or, where measure is link, the time its ring neighbours take to fetch 8 MiB from it (a slow link slows every rank's all-reduce alike, this names it)."""

    step: int | None = None
    """Global step of the comparison."""
    measure: Literal["step", "link"] | None = None
    """What the seconds time: step (forward and loss; also when absent) or link (the faster of its ring neighbours' fetches of 8 MiB from the rank)."""
    median_seconds: float | None = None
    """Median over the ranks."""
    slowest_rank: int | None = None
    """The slowest rank."""
    slowest_seconds: float | None = None
    """Its step time."""
    slowest_pod: str | None = None
    """Its pod."""
    slowest_node: str | None = None
    """Its Kubernetes node."""
    ratio: float | None = None
    """slowestSeconds / medianSeconds."""
    slow_checks: int | None = None
    """Consecutive comparisons this rank was slower than spec.stragglers.factor times the median."""
    straggler: bool | None = None
    """True once slowChecks reaches spec.stragglers.window: the rank is reported as a straggler."""


class RankStepBreakdown(StatusModel):
    """Where one rank's optimizer step goes: mean seconds per optimizer step over the latest window (spec.stragglers.everyNSteps steps; 50 when that is 0). On the CPU the clock is the process's; on a GPU it is the GPU's (CUDA events), so dataWait there is the time the GPU waited for the batch."""

    rank: int | None = None
    """Global rank."""
    data_wait: float | None = None
    """Blocked on the training data loader for the next batch."""
    forward: float | None = None
    """The forward pass and the loss."""
    backward: float | None = None
    """The backward pass, until its last gradient was ready."""
    all_reduce: float | None = None
    """In DDP's collectives: the gradient all-reduce not overlapped with the backward pass, and the broadcast of the model's buffers before the forward (waiting for slower ranks included)."""
    optimizer: float | None = None
    """Gradient clipping and the optimizer step."""


class StepBreakdown(StatusModel):
    """Where the ranks' step time goes, at the latest comparison, and the bottleneck it shows."""

    step: int | None = None
    """Global step of the comparison."""
    world_size: int | None = None
    """Ranks measured."""
    ranks: Annotated[list[RankStepBreakdown], Field(max_length=MAX_BREAKDOWN_RANKS)] | None = None
    """The slowest ranks (by their time outside the all-reduce), slowest first, then the median rank (at most 4)."""
    bottleneck: Annotated[str, Field(max_length=MAX_BOTTLENECK_CHARS, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")] | None = None
    """The bottleneck in one line, e.g. rank 1: 41 % of its step waits on the data loader; trainer.numWorkers 0."""


class Progress(StatusModel):
    """Training progress, reported by rank 0 to the operator, which writes it here."""

    gang_generation: int | None = None
    """The gang generation (status.gang_generation) whose rank 0 sent this, as the operator read it from the reporting pod."""
    epoch: int | None = None
    """Current epoch (from 0)."""
    step: int | None = None
    """Global optimizer step."""
    loss: float | None = None
    """Latest training loss."""
    images_per_second: float | None = None
    """Training throughput over all ranks (warm-up excluded)."""
    updated_at: str | None = None
    """When this was reported (RFC 3339)."""
    step_times: StepTimes | None = None
    """Every rank's step time at the latest comparison (spec.stragglers), and the slowest rank."""
    step_breakdown: StepBreakdown | None = None
    """Where the ranks' step time goes (data wait, forward, backward, all-reduce, optimizer), and the bottleneck."""
    stage: str | None = None
    """What rank 0 is doing: training, validating, checkpointing (writing a checkpoint), exporting (the model is being exported to ONNX), or finishing (training is over; the processes are ending)."""
    metrics: Annotated[dict[str, float], Field(max_length=MAX_REPORTED_METRICS)] | None = None
    """The latest value of val_loss, val_acc, each metric logged with prog_bar=True and each of spec.logging.metrics (at most 64)."""
    validation: str | None = None
    """The first validation metric as name=value, e.g. val_loss=0.412 (the VAL column)."""
    batches: int | None = None
    """Training and validation batches rank 0 has completed since its process started: only the training and validation loops advance it (runPolicy.progressDeadlineSeconds watches it)."""
    batch_time: str | None = None
    """When rank 0 completed the latest of those batches (RFC 3339)."""


class PreflightRank(StatusModel):
    """Where one rank ran."""

    rank: int | None = None
    """Global rank."""
    pod: str | None = None
    """Its pod."""
    node: str | None = None
    """Its Kubernetes node."""


class Preflight(StatusModel):
    """The pre-flight gang check of the current gang, reported by rank 0 before training (nccl.preflightTimeoutSeconds)."""

    backend: str | None = None
    """gloo (CPU) or nccl (GPU)."""
    world_size: int | None = None
    """Ranks that joined."""
    seconds: float | None = None
    """What the whole check cost this start, in seconds."""
    join_seconds: float | None = None
    """Until every rank had joined."""
    all_reduce_bytes: int | None = None
    """Size of the timed all-reduce."""
    all_reduce_ms: float | None = None
    """Median time of that all-reduce, in milliseconds."""
    latency_ms: float | None = None
    """Median time of a one-element all-reduce, in milliseconds."""
    bus_bandwidth_g_bps: Annotated[float | None, Field(alias="busBandwidthGBps")] = None
    """Bus bandwidth of the all-reduce in GB/s, as nccl-tests reports it (2(n-1)/n times size / time)."""
    versions: Annotated[dict[str, str | None], Field(max_length=MAX_REPORTED_VERSIONS)] | None = None
    """torch, CUDA and NCCL versions, the same on every rank."""
    ranks: Annotated[list[PreflightRank], Field(max_length=MAX_REPORTED_RANKS)] | None = None
    """Each rank's pod and node."""
    time: str | None = None
    """When the check ran (RFC 3339)."""


class MissedCheckpoint(StatusModel):
    """A checkpoint that could not be written (object storage, after its retries); training went on."""

    step: int | None = None
    """Global step it was for."""
    path: str | None = None
    """Where it was to go."""
    error: str | None = None
    """The storage's error, credentials removed."""
    time: str | None = None
    """When it was given up (RFC 3339)."""


class CheckpointInfo(StatusModel):
    """The newest checkpoint."""

    step: int | None = None
    """Global step of the checkpoint."""
    path: str | None = None
    """Path of the checkpoint file, or its s3:// or gs:// URL."""
    time: str | None = None
    """When it was written (RFC 3339)."""
    missed: MissedCheckpoint | None = None
    """A later checkpoint that could not be written, until one is written again."""


class StackFrame(StatusModel):
    """One frame of a Python stack: where it runs, never what it holds (no locals, no source text)."""

    module: str | None = None
    """The frame's module, e.g. torch.distributed.distributed_c10d or my_models."""
    function: str | None = None
    """Its function's qualified name, e.g. MyModel.training_step."""
    file: str | None = None
    """Its source file's name, without the directory."""
    line: int | None = None
    """The line it runs."""


class StackGroup(StatusModel):
    """Ranks whose training threads stood in the same frames."""

    ranks: str | None = None
    """The ranks, e.g. 0,2-5."""
    threads: int | None = None
    """Python threads of the first of them."""
    frames: list[StackFrame] | None = None
    """The innermost frames of the training thread, innermost first."""
    code: list[StackFrame] | None = None
    """The innermost frames of the user's or dtrain's code on it (not torch's, Lightning's or the standard library's), innermost first."""


class HangStacks(StatusModel):
    """Every rank's Python stack, as rank 0 collected them when the gang stopped completing batches (a few seconds before runPolicy.progressDeadlineSeconds)."""

    gang_generation: int | None = None
    """The gang generation whose rank 0 sent this, as the operator read it from the reporting pod."""
    time: str | None = None
    """When rank 0 collected them (RFC 3339)."""
    step: int | None = None
    """Global step at which the gang stopped."""
    batches: int | None = None
    """Rank 0's batch counter (status.progress.batches) when it collected them."""
    stalled_seconds: float | None = None
    """How long rank 0 had been without a completed batch."""
    world_size: int | None = None
    """Ranks in the gang."""
    groups: Annotated[list[StackGroup], Field(max_length=MAX_REPORTED_STACK_GROUPS)] | None = None
    """The ranks that answered, grouped by the frames of their training thread."""
    silent: str | None = None
    """Ranks that gave no stack within seconds: stopped (SIGSTOP), cut off from rank 0, or stuck in native code that holds Python's interpreter lock."""
    dumps: str | None = None
    """Where every rank's full stacks (all threads) are: stacks.txt in this directory under artifacts.dir, with hang.json and, where the flight recorder is on, each rank's dump."""


class LastHang(StatusModel):
    """Where the latest hang sat, as the operator named it when runPolicy.progressDeadlineSeconds ran out."""

    time: str | None = None
    """When the deadline ran out (RFC 3339)."""
    step: int | None = None
    """The step the gang was at."""
    ranks: str | None = None
    """The ranks named as not where the others are (silent ones included), e.g. 1 or 3-4; empty when every rank stood in the same place."""
    message: str | None = None
    """Which ranks, on which pods and nodes, in which frame of the user's or dtrain's code, and where the full stacks are."""
    dumps: str | None = None
    """Where every rank's full stacks are (stacks.txt in this directory)."""


class LastRestart(StatusModel):
    """How the latest gang restart was made."""

    generation: int | None = None
    """The gang generation it started."""
    strategy: RestartStrategy | None = None
    """InPlace: the same pods, torchrun started again in each. Recreate: new pods."""
    why: str | None = None
    """Why this strategy: runPolicy.restartStrategy, a failure rule's, or what ruled an in-place restart out."""
    time: str | None = None
    """When it was decided (or changed to Recreate), RFC 3339."""


class ElasticStatus(StatusModel):
    """An elastic gang's size (spec.elastic): the nodes it runs on now, out of those it wants."""

    nodes: int | None = None
    """The nodes the gang runs on now."""
    wanted_nodes: int | None = None
    """spec.nodes: the size it grows back to."""
    min_nodes: int | None = None
    """spec.elastic.minNodes: the fewest it trains on."""
    resizes: int = 0
    """Times the gang restarted on another number of nodes (counted in restartsIgnoringBackoff)."""
    last_resize: str | None = None
    """Why the latest resize was made, and how the global batch was kept."""
    last_resize_time: str | None = None
    """When it was decided (RFC 3339)."""
    capacity_back_step: int | None = None
    """While the gang is smaller: the step of the last checkpoint when a standby pod of every missing node had been placed; the gang grows back at the first checkpoint after it."""


class Goodput(StatusModel):
    """Where the job's time went since it was created, by category (core/goodput.py: productive, redone, queued,
    starting, validating, checkpointing, stalled, restarting, exporting, engine); the categories add up to its age,
    or to its completion once it finished. Written with the operator's other status changes, not on its own."""

    ratio: float | None = None
    """Productive seconds over all of them, 0 to 1 (the GOODPUT column)."""
    seconds: dict[str, float] | None = None
    """Seconds by category."""
    current: str | None = None
    """The category the job is in now; absent once it finished."""
    accounted_at: str | None = None
    """Up to when the seconds are counted (RFC 3339)."""
    highest_step: int | None = None
    """The highest step rank 0 reported, of any gang."""
    redo_until: int | None = None
    """The highest step an earlier gang reached: the current gang's training up to it counts as redone."""


class DistributedTrainingStatus(StatusModel):
    """Observed state, computed by the operator (progress, preflight, lastCheckpoint and hangStacks reported by rank 0).

    It is also the operator's record of the job: what it accepted, restarts, generations and times are read back from
    here at every reconcile. Only the operator writes it (users get `distributedtrainings`, never
    `distributedtrainings/status`)."""

    phase: Phase | None = None
    """Pending, Queued, Starting, Running, Restarting, Exporting, BuildingEngine, Succeeded, Failed or Suspended."""
    conditions: list[Condition] = Field(default_factory=list)
    """Conditions: Created, Running, Restarting, TrainingSucceeded, EngineBuilt, Succeeded, Failed, Suspended, ..."""
    nodes: NodeCounts | None = None
    """Worker pods of the current gang by state."""
    nodes_ready: str | None = None
    """Running worker pods out of all, e.g. 3/4 (the NODES column)."""
    restarts: int = 0
    """Gang restarts so far (those that count against backoffLimit)."""
    evictions: int = 0
    """Times Kueue evicted the gang (preemption): each restarted it, counted against no backoffLimit."""
    restarts_ignoring_backoff: int = 0
    """Gang restarts that a RestartGangIgnoringBackoff rule of runPolicy.failureRules decided, and an elastic gang's resizes and the node losses that lead to them: counted against no backoffLimit."""
    restarts_in_place: int = 0
    """Of restarts and restartsIgnoringBackoff, those made in place (runPolicy.restartStrategy InPlace): the pods stayed, torchrun started again in each."""
    in_place_generation: int | None = None
    """The gang generation that restarts in place: the previous generation's pods are kept, relabelled with it once every supervisor has stopped its torchrun. None: the pods of an earlier generation are deleted."""
    last_restart: LastRestart | None = None
    """How the latest gang restart was made (in place or by recreating the pods) and why."""
    elastic: ElasticStatus | None = None
    """An elastic job's gang size (spec.elastic)."""
    start_time: str | None = None
    """When the job started (RFC 3339)."""
    completion_time: str | None = None
    """When the job finished (RFC 3339)."""
    succeeded_ranks: list[Annotated[int, Field(ge=0)]] | None = None
    """Ranks of the current gang generation that exited 0: finished, even once their pods are gone."""
    progress: Progress | None = None
    """Training progress."""
    last_checkpoint: CheckpointInfo | None = None
    """The newest checkpoint."""
    preflight: Preflight | None = None
    """The pre-flight gang check of the latest gang start: all-reduce latency and bus bandwidth."""
    hang_stacks: HangStacks | None = None
    """Every rank's Python stack when the gang last stopped completing batches, sent by rank 0 (runPolicy.progressDeadlineSeconds reads it)."""
    last_hang: LastHang | None = None
    """Where the latest hang sat: the ranks not where the others are, their pods, nodes and frames (runPolicy.progressDeadlineSeconds)."""
    goodput: Goodput | None = None
    """Where the job's time went, by category, and the productive share of it."""
    artifacts: InitArgs | None = None
    """What training and the engine Job produced: ONNX file, parity error, engine, latency report."""
    observed_generation: int | None = None
    """The spec generation this status describes."""
    accepted_spec: InitArgs | None = None
    """The spec the job was created with (defaults filled in). The operator runs this spec; later changes to immutable fields are reported in the SpecImmutable condition, not applied."""

    @property
    def gang_generation(self) -> int:
        """Which gang runs now: every restart made a new one, counted (restarts) or not (evictions,
        restartsIgnoringBackoff); its pods carry it in their dtrain.dev/gang-generation label."""
        return self.restarts + self.evictions + self.restarts_ignoring_backoff

