"""When a gang restarts and how a job ends: one implementation for the operator and `dtrain run`.

DDP cannot lose a rank, so any worker failure stops the whole gang; these pure
functions decide whether the gang starts again from its last checkpoint or the
job ends, and how it ends after training (the export, the engine) or past its
deadline. Neither caller decides this anywhere else.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from dtrain_operator.api import RunPolicy, contract
from dtrain_operator.core import queueing

# Exit codes of 128 and above mean the process was killed by a signal (128 + n):
# OOM kills (137), node shutdowns and preemption (143). Below that, the program
# itself chose to fail, which a restart will not fix.
SIGNAL_EXIT_CODE_BASE = 128

REASON_BACKOFF_LIMIT = "BackoffLimitExceeded"
REASON_NON_RETRYABLE_EXIT = "NonRetryableExitCode"
REASON_RESTART_POLICY_NEVER = "RestartPolicyNever"
REASON_WORKER_FAILED = "WorkerFailed"
REASON_DEADLINE = "DeadlineExceeded"
# Training succeeded but what comes after did not: the operator and `dtrain run` both end a job so.
REASON_EXPORT_FAILED = "ExportFailed"
REASON_ENGINE_BUILD_FAILED = "EngineBuildFailed"
REASON_TRAINING_SUCCEEDED = "TrainingSucceeded"
REASON_ENGINE_BUILT = "EngineBuilt"
# The trainer exited with contract.TRAINER_EXIT_INVALID_CONFIG: its settings are wrong.
REASON_INVALID_TRAINER_CONFIG = "InvalidTrainerConfig"


@dataclass(frozen=True)
class WorkerFailure:
    """A worker that stopped without success.

    exit_code is None when the process never got to exit by itself: the pod was
    evicted, preempted, deleted, or its node was lost.
    """

    rank: int
    exit_code: int | None
    reason: str = "Error"
    message: str = ""
    finished_at: datetime | None = None

    def describe(self) -> str:
        if self.exit_code is None:
            what = f"worker {self.rank} was lost ({self.reason})"
        else:
            what = f"worker {self.rank} exited with code {self.exit_code}"
            if self.reason and self.reason not in ("Error", "Completed"):
                what += f" ({self.reason})"
        return f"{what}: {self.message}" if self.message else what


@dataclass(frozen=True)
class Ending:
    """How a job ends: the phase, reason and message of its status, or of `dtrain run`'s summary."""

    phase: Literal["Succeeded", "Failed"]
    reason: str
    message: str


@dataclass(frozen=True)
class FailureDecision:
    """What to do about a failed gang: restart it, or fail the job with a reason."""

    restart: bool
    reason: str
    message: str
    counted: bool = True
    """Whether the restart counts against backoffLimit: not when a queue took the gang away."""

    @property
    def ending(self) -> Ending:
        return Ending("Failed", self.reason, self.message)


def is_invalid_trainer_config(failure: WorkerFailure) -> bool:
    """The trainer said its settings are wrong (a bad classPath, initArgs, checkpoint dir, ...)."""
    return failure.exit_code == contract.TRAINER_EXIT_INVALID_CONFIG


def trainer_error(message: str) -> str:
    """The trainer's own error line from a termination message (its JSON results), else the message."""
    text = message.strip()
    if text.startswith("{"):
        try:
            document = json.loads(text)
        except ValueError:
            return text
        if isinstance(document, dict) and isinstance(document.get("error"), str):
            return str(document["error"])
    return text


def is_retryable(policy: RunPolicy, failure: WorkerFailure) -> bool:
    """Whether a restart could cure this failure under the job's restart policy."""
    if is_invalid_trainer_config(failure):
        return False
    if policy.restart_policy == "Never":
        return False
    if policy.restart_policy == "ExitCode":
        return failure.exit_code is None or failure.exit_code >= SIGNAL_EXIT_CODE_BASE
    return True


# Kubernetes reports when a container finished to the second: failures this close together
# cannot be ordered, and each may be the cause.
SAME_MOMENT_SECONDS = 1.0


def root_causes(failures: Sequence[WorkerFailure]) -> list[WorkerFailure]:
    """The failures that came first, and every worker that was lost.

    When one rank dies, its peers fail moments later with errors of their own (a broken
    connection, exit code 1): consequences, not causes. Without a finish time for every
    failure they cannot be told apart, and all count. A worker that was lost (evicted,
    deleted, its node gone: no exit code) is a cause whatever its time: its peers see the
    loss at once, while its pod is only marked once the node is found gone, much later.
    """
    timed = [(f, f.finished_at) for f in failures if f.finished_at is not None]
    if len(timed) < len(failures):
        return list(failures)
    first = min(t for _, t in timed)
    return [f for f, t in timed if f.exit_code is None or (t - first).total_seconds() <= SAME_MOMENT_SECONDS]


def decide_on_failure(policy: RunPolicy, failures: Sequence[WorkerFailure], restarts: int) -> FailureDecision:
    """Restart the gang or fail the job, given the failed workers and the restarts so far."""
    if not failures:
        raise ValueError("decide_on_failure needs at least one failed worker")
    ordered = sorted(failures, key=lambda f: f.rank)
    evicted = [f for f in ordered if queueing.is_queue_stop(f.reason)]
    if evicted:
        # Kueue took the quota back: the gang saved its checkpoint on SIGTERM and waits to be admitted again.
        return FailureDecision(
            True,
            queueing.REASON_EVICTED,
            f"Kueue evicted the gang ({evicted[0].message or evicted[0].reason}); it is queued again and resumes "
            "from its checkpoint once admitted (not counted against backoffLimit)",
            counted=False,
        )
    invalid = [f for f in ordered if is_invalid_trainer_config(f)]
    if invalid:
        # No restart can cure it, whatever restartPolicy says: fail now, with the trainer's own words.
        first = invalid[0]
        error = trainer_error(first.message) or f"exit code {first.exit_code}"
        return FailureDecision(
            False,
            REASON_INVALID_TRAINER_CONFIG,
            f"worker {first.rank}: {error} (the trainer's settings are wrong and a restart cannot cure that: "
            "fix the spec and create the job again)",
        )
    summary = "; ".join(f.describe() for f in ordered)
    if policy.restart_policy == "Never":
        return FailureDecision(False, REASON_RESTART_POLICY_NEVER, f"{summary} (restartPolicy is Never)")
    if not any(is_retryable(policy, f) for f in root_causes(ordered)):
        return FailureDecision(
            False,
            REASON_NON_RETRYABLE_EXIT,
            f"{summary} (restartPolicy ExitCode: codes 1-127 are errors of the program and are not retried)",
        )
    if restarts >= policy.backoff_limit:
        return FailureDecision(
            False,
            REASON_BACKOFF_LIMIT,
            f"{summary} (gang restarted {restarts} time(s), backoffLimit is {policy.backoff_limit})",
        )
    return FailureDecision(
        True,
        REASON_WORKER_FAILED,
        f"{summary}; restarting the gang from the last checkpoint ({restarts + 1}/{policy.backoff_limit})",
    )


def deadline_exceeded(policy: RunPolicy, started: datetime | None, now: datetime) -> bool:
    """Whether the job has run past runPolicy.activeDeadlineSeconds."""
    if policy.active_deadline_seconds is None or started is None:
        return False
    return (now - started).total_seconds() > policy.active_deadline_seconds


def deadline_ending(policy: RunPolicy) -> Ending:
    """A job past runPolicy.activeDeadlineSeconds fails, whatever step it is at."""
    message = f"the job ran longer than activeDeadlineSeconds ({policy.active_deadline_seconds} s)"
    return Ending("Failed", REASON_DEADLINE, message)


def ending_after_training(export_error: str | None, engine_enabled: bool) -> Ending | None:
    """Training succeeded: how the job ends now, or None when the engine is to be built next.

    A failed export fails the job only when an engine was asked for, since it is built from model.onnx;
    the checkpoints stay, and the gang does not restart (training again would end in the same export)."""
    if export_error:
        if engine_enabled:
            return Ending(
                "Failed",
                REASON_EXPORT_FAILED,
                f"training succeeded but the ONNX export failed, so no engine is built: {export_error}",
            )
        return Ending("Succeeded", REASON_TRAINING_SUCCEEDED, f"training succeeded; the ONNX export failed: {export_error}")
    if not engine_enabled:
        return Ending("Succeeded", REASON_TRAINING_SUCCEEDED, "training succeeded (engine.enabled is false)")
    return None


def engine_ending(built: bool, builder: str, detail: str = "") -> Ending:
    """The engine build's end is the job's: `builder` names what built it (the engine Job, `dtrain build-engine`)."""
    if built:
        return Ending("Succeeded", REASON_ENGINE_BUILT, "training succeeded and the engine is built")
    return Ending("Failed", REASON_ENGINE_BUILD_FAILED, f"{builder} failed" + (f": {detail}" if detail else ""))
