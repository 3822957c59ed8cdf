"""`dtrain run FILE`: the job's whole pipeline on this machine.

The job file is validated as `dtrain validate` does, and each worker pod the operator
would create runs here as a local torchrun "node" with the pod's launch environment.
A failing node stops the gang; the operator's own rules (`core.restart_decision`,
`core.progress_deadline`, `core.stragglers`) decide whether it restarts from the last
checkpoint, when it hangs, and how the run ends (the deadline, the export, the engine
step, which runs as the engine Job would); a summary closes the run.
"""

# layout: one run's state machine (train, restart, export, engine, stop) reads best in one class (a little
# over 400 lines); the plan, the gang, the display and the summary are modules of their own.

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import yaml

from dtrain_operator.api import DistributedTraining, HangStacks, StepTimes, contract, records
from dtrain_operator.api.job_dirs import missing_shared_storage
from dtrain_operator.api.results import TrainerResults, read_termination_message
from dtrain_operator.api.validation import EXIT_INVALID_JOB, load_job
from dtrain_operator.core import (
    child_names,
    elastic,
    hang_diagnosis,
    policy,
    progress_deadline,
    render,
    restart_decision,
    stragglers,
)
from dtrain_operator.core.storage_volumes import object_store_env
from dtrain_operator.local.display import Display
from dtrain_operator.local.launch_plan import (
    LocalJob,
    NodeLaunch,
    Overrides,
    PlanError,
    Workdir,
    default_workdir,
    engine_argv,
    failure_excerpt,
    localize,
    node_launches,
    termination_message,
    worker_exit_code,
)
from dtrain_operator.local.process_gang import Gang, become_child_subreaper
from dtrain_operator.local.progress_file import JsonlTail
from dtrain_operator.local.summary import RunSummary, collect_summary

if TYPE_CHECKING:
    from typing_extensions import Self

EXIT_FAILED = 1
POLL_SECONDS = 0.25
# How often the process trees are walked for descendants (they change rarely).
TREE_WALK_SECONDS = 1.0
# torchrun passes SIGTERM to its workers and waits for them; after this, everything left is killed.
STOP_GRACE_SECONDS = 10.0
FAILURE_LOG_LINES = 30

# How a run ends. Succeeded and Failed are api.Phase's; Stopped is dtrain run's own (the user stopped it,
# Ctrl-C or a signal), which a cluster job has no counterpart of: a deleted job is gone.
RunPhase = Literal["Running", "Succeeded", "Failed", "Stopped"]
PHASE_SUCCEEDED: RunPhase = "Succeeded"
PHASE_FAILED: RunPhase = "Failed"
PHASE_STOPPED: RunPhase = "Stopped"
REASON_STOPPED = "Stopped"


class StopRequest:
    """SIGINT, SIGTERM and SIGHUP ask the run to stop; the run stops its processes itself, in order."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Self:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""


@dataclass
class StepOutcome:
    """How a gang (or the engine build) ended."""

    succeeded: bool = False
    failures: list[policy.WorkerFailure] = field(default_factory=list)
    stopped: bool = False
    deadline: bool = False
    # The gang ran past runPolicy.progressDeadlineSeconds: what progress_deadline.decide said.
    hang: policy.FailureDecision | None = None

    def hang_decision(self) -> policy.FailureDecision | None:
        """The hang, asked for as core.restart_decision asks the operator's progress deadline."""
        return self.hang


@dataclass
class RunState:
    """What the run has done so far: the summary's inputs."""

    phase: RunPhase = "Running"
    reason: str = ""
    message: str = ""
    restarts: int = 0
    restarts_ignoring_backoff: int = 0
    # The nodes the gang runs on: spec.nodes, fewer once an elastic job lost some (core.elastic).
    nodes: int = 0
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    # Where the latest hang sat (core.hang_diagnosis), as the operator keeps it in status.lastHang.
    last_hang: str | None = None

    @property
    def generation(self) -> int:
        """Which gang runs now: every restart starts a new one, counted against backoffLimit or not."""
        return self.restarts + self.restarts_ignoring_backoff


def free_port() -> int:
    """A TCP port free right now on the loopback interface, for torchrun's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def cuda_devices_here(job: DistributedTraining) -> list[str]:
    """This machine's CUDA devices as CUDA_VISIBLE_DEVICES names them (asked only for GPU jobs)."""
    if job.spec.accelerator != "gpu":
        return []
    try:
        import torch
    except ImportError:
        return []
    count = torch.cuda.device_count()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [d.strip() for d in visible.split(",") if d.strip()][:count]
    return [str(i) for i in range(count)]


def prepare_workdir(workdir: Workdir, resume: bool) -> bool:
    """Create the workdir; a fresh run clears what an earlier run left. True when something was cleared."""
    workdir.root.mkdir(parents=True, exist_ok=True)
    cleared = False
    if not resume:
        for entry in workdir.owned_entries():
            if entry.is_dir():
                shutil.rmtree(entry)
                cleared = True
            elif entry.exists():
                entry.unlink()
                cleared = True
    for directory in (workdir.checkpoints, workdir.artifacts, workdir.logs):
        directory.mkdir(parents=True, exist_ok=True)
    return cleared


class LocalRun:
    """One `dtrain run`: the gang's lifecycle, then the engine step."""

    def __init__(
        self, local: LocalJob, workdir: Workdir, display: Display, stop: StopRequest, adopts_orphans: bool
    ) -> None:
        self.local = local
        self.adopts_orphans = adopts_orphans
        self.job = local.job
        self.workdir = workdir
        self.display = display
        self.stop = stop
        self.state = RunState(nodes=local.job.spec.nodes)
        self.progress = JsonlTail(workdir.progress)
        # The latest progress record of the running gang, and the watch on it (progressDeadlineSeconds).
        self._progress: Any | None = None
        self._progress_watch: progress_deadline.ProgressWatch | None = None
        # Every rank's stacks as rank 0 last collected them in the running gang (its hang record).
        self._hang_stacks: HangStacks | None = None
        self._straggler_warned: str | None = None
        self.cores = available_cores()

    # --- training ---------------------------------------------------------------------

    def train(self) -> bool:
        run_policy = self.job.spec.run_policy
        while True:
            launches, warnings = node_launches(
                self.local, self.workdir, free_port(), os.environ, self.cores, self.state.nodes
            )
            generation = self.state.generation
            if generation == 0:
                for warning in warnings:
                    self.display.warn(warning)
            for launch in launches:  # each node starts with none, as a new pod does
                self.workdir.termination_log(launch.rank).unlink(missing_ok=True)
            gang = Gang.start(
                launches,
                [self.workdir.node_log(launch.rank) for launch in launches],
                f"gang generation {generation}, {datetime.now(timezone.utc).isoformat(timespec='seconds')}",
                adopts_orphans=self.adopts_orphans,
            )
            self.display.gang_started(generation, [launch.rank for launch in launches], gang.pids)
            self._progress, self._progress_watch, self._hang_stacks = None, None, None
            outcome = self._watch(gang, on_exit=self._node_failures, watch_progress=True)
            if outcome.hang is not None and outcome.hang.restart:
                self.display.warn(f"{outcome.hang.reason}: {outcome.hang.message}")
            # Even after a success, nothing the gang started may outlive it. A hung gang cannot reach
            # the step where SIGTERM would stop it: it gets the operator's short grace for hung pods.
            gang.stop(progress_deadline.HUNG_GANG_GRACE_SECONDS if outcome.hang is not None else STOP_GRACE_SECONDS)
            if outcome.succeeded:
                self.display.progress_done()
                return True
            self._drain_progress()
            self.display.progress_done()
            if outcome.stopped:
                return self._stopped()
            if outcome.deadline:
                return self._end(policy.deadline_ending(run_policy))
            # A hung gang's nodes were stopped here: they are not lost.
            resize = self._lost_nodes(gang) if outcome.hang is None else None
            if resize is not None:
                self.state.nodes = resize.nodes
                self.state.restarts_ignoring_backoff += 1
                self.display.warn(resize.message)
                continue
            for failure in outcome.failures:
                node = gang.nodes[failure.rank]
                excerpt = failure_excerpt(node.log_since_start(), FAILURE_LOG_LINES)
                self.display.log_tail(f"node {failure.rank}", node.log_path, excerpt)
            decision = restart_decision.decide(self.job.spec, outcome.failures, self.state.restarts, outcome.hang_decision)
            assert decision is not None, outcome  # the gang ended: it failed or hung
            if not decision.restart:
                return self._end(decision.ending)
            if decision.counted:
                self.state.restarts += 1
            else:
                self.state.restarts_ignoring_backoff += 1
            if outcome.failures:  # a hang's restart was said as it was decided
                self.display.warn(decision.message)

    def _lost_nodes(self, gang: Gang) -> elastic.Resize | None:
        """An elastic job's smaller gang when nodes were lost: a node's launcher killed by a signal from outside
        (a pod's node gone, here), which is not started again."""
        lost = sorted(rank for rank, code in gang.exited().items() if code < 0)
        nodes = ", ".join(map(str, lost))
        return elastic.after_lost_nodes(self.job.spec, self.state.nodes, len(lost), f"node(s) {nodes} stopped for good")

    def _node_failures(self, gang: Gang) -> StepOutcome | None:
        """The gang's end, once it is decided: all nodes done, or the first failures."""
        exited = gang.exited()
        failures = []
        for rank, code in sorted(exited.items()):
            if code != 0:
                exit_code = worker_exit_code(code)
                written = self._trainer_message(rank)
                pods = termination_message(written, gang.nodes[rank].log_since_start())
                failures.append(policy.WorkerFailure(rank, exit_code, _reason(exit_code), written, termination_message=pods))
        if failures:
            return StepOutcome(failures=failures)
        if len(exited) == len(gang.nodes):
            return StepOutcome(succeeded=True)
        return None

    def _trainer_message(self, rank: int) -> str:
        """What the node's trainer left as its termination message, as a pod's would be."""
        try:
            return self.workdir.termination_log(rank).read_text()
        except OSError:
            return ""

    def _watch(
        self, gang: Gang, on_exit: Callable[[Gang], StepOutcome | None], watch_progress: bool = False
    ) -> StepOutcome:
        run_policy = self.job.spec.run_policy
        last_walk = 0.0
        while True:
            self._drain_progress()
            if self.stop.requested:
                return StepOutcome(stopped=True)
            now = datetime.now(timezone.utc)
            if policy.deadline_exceeded(run_policy, self.state.started, now):
                return StepOutcome(deadline=True)
            if watch_progress:
                # The same watch and the same decision as the operator's; every node runs while none exited.
                all_running = not gang.exited()
                self._progress_watch = progress_deadline.observe(
                    self._progress_watch, self.state.generation, all_running, self._progress, now
                )
                hang = progress_deadline.decide(run_policy, self._progress_watch, now, self.state.restarts)
                if hang is not None:
                    return StepOutcome(hang=self._where_it_hangs(hang))
            if time.monotonic() - last_walk >= TREE_WALK_SECONDS:
                gang.remember_descendants()
                last_walk = time.monotonic()
            outcome = on_exit(gang)
            if outcome is not None:
                self._drain_progress()
                return outcome
            time.sleep(POLL_SECONDS)

    def _drain_progress(self) -> None:
        for raw in self.progress.read_new():
            record = records.read_record(raw)
            if isinstance(record, records.ProgressRecord):
                self._progress = progress_deadline.progress_from_record(raw)
                self._note_straggler(record.step_times)
            elif isinstance(record, records.HangRecord):
                self._hang_stacks = hang_diagnosis.stacks_of_record(raw)
            self.display.progress(raw, self.state.generation)
        self.display.tick()

    def _where_it_hangs(self, hang: policy.FailureDecision) -> policy.FailureDecision:
        """The deadline's decision with where the hang sits, named as the operator names it."""
        stacks = hang_diagnosis.current_stacks(self._hang_stacks, self._progress, None)
        diagnosis = hang_diagnosis.diagnose(stacks, self.state.nodes * self.job.spec.devices_per_node, self._place)
        self.state.last_hang = diagnosis.message
        return hang_diagnosis.explained(hang, diagnosis)

    def _place(self, rank: int) -> str:
        """Where a global rank runs on this machine: its node's pod name (as on a cluster) and local node."""
        node = rank // self.job.spec.devices_per_node
        return f"pod {child_names.worker_pod_name(self.job, node)}, local node {node}"

    def _note_straggler(self, times: StepTimes | None) -> None:
        """Warn once per straggler, as the operator posts one Warning Event."""
        message = stragglers.straggler_message(times, self.job.spec.stragglers, self._place)
        if message is not None and message != self._straggler_warned:
            self.display.warn(message)
        self._straggler_warned = message

    def _end(self, ending: policy.Ending) -> bool:
        """The run ends as the operator would end the job; True when it succeeded."""
        self.state.phase, self.state.reason, self.state.message = ending.phase, ending.reason, ending.message
        if ending.phase == PHASE_FAILED:
            self.display.error(ending.message)
        return ending.phase == PHASE_SUCCEEDED

    def _stopped(self) -> bool:
        self.state.phase, self.state.reason = PHASE_STOPPED, REASON_STOPPED
        self.state.message = f"stopped by {self.stop.name}; every process of the run has ended"
        self.display.warn(self.state.message)
        return False

    def after_training(self, engine_asked: bool) -> bool:
        """Training succeeded: the job's end by the operator's rule (core.policy), or the engine build."""
        results = TrainerResults.read(read_termination_message(self._trainer_message(0)))
        export_error = results.export_error if results is not None else None
        ending = policy.ending_after_training(export_error, engine_asked)
        if ending is None:
            return self.build_engine()
        if export_error and ending.phase == PHASE_SUCCEEDED:
            self.display.warn(ending.message)
        return self._end(ending)

    # --- the engine -------------------------------------------------------------------

    def build_engine(self) -> bool:
        argv = engine_argv(self.job, self.workdir)
        env = {
            **os.environ,
            **object_store_env(self.job),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(self.cores)),
            "PYTHONUNBUFFERED": "1",
            contract.ENV_TERMINATION_LOG: str(self.workdir.engine_termination_log),
        }
        if self.local.cuda_devices and self.local.cuda_devices[0]:
            env["CUDA_VISIBLE_DEVICES"] = self.local.cuda_devices[0][0]
        self.display.info(f"building the engine (dtrain build-engine; log: {self.workdir.engine_log})")
        build = Gang.start(
            [NodeLaunch(0, argv, env)], [self.workdir.engine_log], "engine build", adopts_orphans=self.adopts_orphans
        )
        outcome = self._watch(build, on_exit=_engine_end)
        build.stop(STOP_GRACE_SECONDS)
        if outcome.stopped:
            return self._stopped()
        if outcome.deadline:
            return self._end(policy.deadline_ending(self.job.spec.run_policy))
        node = build.nodes[0]
        if not outcome.succeeded:
            excerpt = failure_excerpt(node.log_since_start(), FAILURE_LOG_LINES)
            self.display.log_tail("engine build", node.log_path, excerpt)
        detail = f"exit code {node.popen.returncode}"
        return self._end(policy.engine_ending(outcome.succeeded, "dtrain build-engine", detail))

    def summary(self, engine_asked: bool) -> RunSummary:
        return collect_summary(
            self.job,
            self.workdir,
            phase=self.state.phase,
            reason=self.state.reason,
            message=self.state.message,
            restarts=self.state.restarts,
            restarts_ignoring_backoff=self.state.restarts_ignoring_backoff,
            wall_seconds=(datetime.now(timezone.utc) - self.state.started).total_seconds(),
            engine_asked=engine_asked,
            last_hang=self.state.last_hang,
        )


def _engine_end(build: Gang) -> StepOutcome | None:
    code = build.exited().get(0)
    return None if code is None else StepOutcome(succeeded=code == 0)


def _reason(exit_code: int) -> str:
    if exit_code > policy.SIGNAL_EXIT_CODE_BASE:
        try:
            return signal.Signals(exit_code - policy.SIGNAL_EXIT_CODE_BASE).name
        except ValueError:
            pass
    return "Error"


def main(args: argparse.Namespace) -> int:
    job, errors = load_job(args.file)
    if job is None:
        for error in errors:
            print(error, file=sys.stderr)
        return EXIT_INVALID_JOB
    root = Path(args.workdir) if args.workdir else default_workdir(job, Path.cwd())
    workdir = Workdir(root.resolve())
    try:
        local = localize(job, Overrides(args.nodes, args.devices_per_node), workdir, cuda_devices_here(job))
    except PlanError as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return EXIT_INVALID_JOB
    display = Display.for_stream(sys.stdout)
    for warning in local.warnings:
        display.warn(warning)
    cluster_refusal = missing_shared_storage(job.spec, job.namespace, job.name)
    if cluster_refusal:
        # This machine's disk is shared by its nodes; a cluster's pods share none (docs/storage.md).
        display.info(f"runs here; a cluster would refuse it: {cluster_refusal.removeprefix('spec.storage: ')}")
    if prepare_workdir(workdir, args.resume):
        display.info(f"cleared the previous run in {workdir.root} (--resume continues from its checkpoint instead)")
    workdir.config.write_text(yaml.safe_dump(render.trainer_config(local.job), sort_keys=False))
    spec = local.job.spec
    engine_asked = spec.engine.enabled and not args.no_engine
    display.info(
        f"{job.name}: {spec.nodes} node(s) x {spec.devices_per_node} {spec.accelerator} process(es); "
        f"workdir {workdir.root}"
    )
    adopts_orphans = become_child_subreaper()
    with StopRequest() as stop:
        run = LocalRun(local, workdir, display, stop, adopts_orphans)
        if args.resume:
            run.progress.skip_existing()
        if run.train():
            run.after_training(engine_asked)
        summary = run.summary(engine_asked)
    summary.write(workdir.summary)
    display.summary(summary)
    if run.state.phase == PHASE_STOPPED:
        display.stopped_hint(summary.checkpoint, args.file)
        return policy.SIGNAL_EXIT_CODE_BASE + (stop.signum or signal.SIGINT)
    return 0 if run.state.phase == PHASE_SUCCEEDED else EXIT_FAILED
