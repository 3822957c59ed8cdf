"""When a gang restarts and how a job ends: one implementation for the operator and `dtrain run`.

DDP cannot lose a rank, so any worker failure stops the whole gang; these pure
functions decide whether the gang starts again from its last checkpoint or the
job ends, and how it ends after training (the export, the engine) or past its
deadline. Neither caller decides this anywhere else.

A failure is decided by rules (api.failure_rules): runPolicy.failureRules in order, then the
rules that restartPolicy stands for; the first that matches one of the failures that stopped
the gang decides, and the decision's message names it when it is one of the user's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from dtrain_operator.api import FailureRule, RunPolicy, contract, failure_rules, restart_policy_rules
from dtrain_operator.api.failure_rules import RestartStrategy
from dtrain_operator.api.reasons import reason
from dtrain_operator.core import queueing

# Exit codes of 128 and above mean the process was killed by a signal (128 + n):
# OOM kills (137), node shutdowns and preemption (143). Below that, the program
# itself chose to fail, which a restart will not fix.
SIGNAL_EXIT_CODE_BASE = 128

_FIX_AND_RECREATE = "fix what the message names (`dtrain logs NAME --previous`), then create the job again"
REASON_BACKOFF_LIMIT = reason("BackoffLimitExceeded", "the gang failed again with its runPolicy.backoffLimit restarts "
                              "spent (Failed)", _FIX_AND_RECREATE)
REASON_NON_RETRYABLE_EXIT = reason("NonRetryableExitCode", "a worker exited with 1-127, an error of the program that "
                                   "restartPolicy ExitCode does not retry (Failed)", _FIX_AND_RECREATE)
REASON_RESTART_POLICY_NEVER = reason("RestartPolicyNever", "a worker failed and restartPolicy is Never (Failed)",
                                     _FIX_AND_RECREATE)
REASON_WORKER_FAILED = reason("WorkerFailed", "a worker failed or was lost; the gang restarts from its last checkpoint "
                              "(Restarting)", "nothing, unless it repeats: the message quotes the worker's error")
REASON_DEADLINE = reason("DeadlineExceeded", "the job ran longer than runPolicy.activeDeadlineSeconds (Failed)",
                         "raise activeDeadlineSeconds, or make the job shorter (maxEpochs, maxSteps)")
# Training succeeded but what comes after did not: the operator and `dtrain run` both end a job so.
REASON_EXPORT_FAILED = reason("ExportFailed", "training succeeded but the ONNX export failed, so no engine can be "
                              "built (Failed; the checkpoints stay)", "make the model exportable, then run again")
REASON_ENGINE_BUILD_FAILED = reason("EngineBuildFailed", "the engine Job failed to build the TensorRT engine (Failed, "
                                    "EngineBuilt False)", "`kubectl logs job/NAME-engine`; the model and checkpoints stay")
REASON_TRAINING_SUCCEEDED = reason("TrainingSucceeded", "training is over (Running False); the job ends here when no "
                                   "engine is asked for or the export failed (Succeeded)")
REASON_ENGINE_BUILT = reason("EngineBuilt", "training succeeded and the engine is built (Succeeded)")
# The trainer exited with contract.TRAINER_EXIT_INVALID_CONFIG: its settings are wrong.
REASON_INVALID_TRAINER_CONFIG = reason(failure_rules.REASON_INVALID_TRAINER_CONFIG, "the trainer found its settings "
                                       "wrong (classPath, initArgs, ...): no restart can cure it (Failed)",
                                       "fix the spec as the message says and create the job again")
# A FailJob rule of runPolicy.failureRules failed the job.
REASON_FAILED_BY_RULE = reason("FailedByRule", "a FailJob rule of runPolicy.failureRules matched a failure (Failed); "
                               "the message names the rule", _FIX_AND_RECREATE)
# Kubernetes' reasons that dtrain's names for failure rules cover (besides those names themselves).
REASON_ALIASES = {
    failure_rules.REASON_PREEMPTED: frozenset({"PreemptionByScheduler", "Preempting"}),
    failure_rules.REASON_EVICTED: frozenset({"EvictionByEvictionAPI"}),
}
# The failure's message, in a decision's message: the end of a log is where its error is.
MAX_FAILURE_MESSAGE_CHARS = 400
# A termination-message pattern, in the message that names the rule that decided.
MAX_PATTERN_ECHO_CHARS = 40


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
    """The pod's termination message (or, for a lost pod, its status message): decisions quote its end."""
    finished_at: datetime | None = None
    termination_message: str | None = None
    """What failure rules' onTerminationMessage is matched against when it is not `message`: `dtrain run` shows a
    failed node's log itself, and quotes in its message only what the trainer wrote, not the log's end that a
    pod's termination message (FallbackToLogsOnError) would hold."""
    in_pod: bool = False
    """Its pod still runs: its supervisor reported torchrun's exit (a restart in place can reuse the pod)."""

    @property
    def matched_message(self) -> str:
        return self.message if self.termination_message is None else self.termination_message

    def describe(self) -> str:
        if self.exit_code is None:
            what = f"worker {self.rank} was lost ({self.reason})"
        else:
            what = f"worker {self.rank} exited with code {self.exit_code}"
            if self.reason and self.reason not in ("Error", "Completed"):
                what += f" ({self.reason})"
        message = message_tail(self.message)
        return f"{what}: {message}" if message else what


# A Python exception's own line, as a traceback ends: its type (dotted or not) and its message.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure|Fault)(?::\s.*)?$")
# Exceptions that only wrap a worker's own (torchrun's, around the rank that failed): the worker's line says more.
_WRAPPING_EXCEPTIONS = frozenset({"ChildFailedError"})


def message_tail(text: str, limit: int = MAX_FAILURE_MESSAGE_CHARS) -> str:
    """What a failure's condition and Event quote of a termination message or log: the exception's own line
    (type and message) where the text holds a Python traceback, the worker's rather than torchrun's wrapper; else
    the text's end."""
    lines = [line.rstrip() for line in text.splitlines()]
    raised = [line for line in lines if _EXCEPTION_LINE.match(line)]
    own = [line for line in raised if line.split(":", 1)[0].rsplit(".", 1)[-1] not in _WRAPPING_EXCEPTIONS]
    if raised:
        line = (own or raised)[-1]
        return line if len(line) <= limit else line[: limit - 3] + "..."
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


@dataclass(frozen=True)
class Ending:
    """How a job ends: the phase, reason and message of its status, or of `dtrain run`'s summary."""

    phase: Literal["Succeeded", "Failed"]
    reason: str
    message: str


RestartCount = Literal["restarts", "evictions", "restartsIgnoringBackoff"]


@dataclass(frozen=True)
class FailureDecision:
    """What to do about a failed gang: restart it, or fail the job with a reason."""

    restart: bool
    reason: str
    message: str
    count: RestartCount = "restarts"
    """The count a restart adds to: restarts (against backoffLimit), evictions (Kueue took the gang away) or
    restartsIgnoringBackoff (a RestartGangIgnoringBackoff rule decided)."""
    strategy: RestartStrategy | None = None
    """The deciding failure rule's restartStrategy (None: runPolicy.restartStrategy's)."""
    rule_name: str = ""
    """failureRules[i], for a message that says why the strategy is what it is."""

    @property
    def counted(self) -> bool:
        """Whether the restart counts against backoffLimit."""
        return self.count == "restarts"

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


def failure_reasons(failure: WorkerFailure) -> frozenset[str]:
    """The names a failure rule's onReasons may give this failure: its own reason, and dtrain's names that
    cover it (Lost, Preempted, Evicted, InvalidTrainerConfig)."""
    names = {failure.reason} if failure.reason else set()
    if failure.exit_code is None:
        names.add(failure_rules.REASON_LOST)
    if is_invalid_trainer_config(failure):
        names.add(REASON_INVALID_TRAINER_CONFIG)
    names.update(name for name, covered in REASON_ALIASES.items() if failure.reason in covered)
    return frozenset(names)


def rule_matches(rule: FailureRule, failure: WorkerFailure) -> bool:
    """Whether the failure meets every condition of the rule (a rule without conditions matches any)."""
    if rule.on_exit_codes is not None:
        code = failure.exit_code
        if code is None or not any(low <= code <= high for low, high in rule.exit_code_ranges()):
            return False
    if rule.on_reasons is not None and not failure_reasons(failure) & set(rule.on_reasons):
        return False
    pattern = rule.on_termination_message
    return pattern is None or failure_rules.re2_search(pattern, failure.matched_message)


@dataclass(frozen=True)
class RuleMatch:
    """The rule that decides, and the failure it matched."""

    rule: FailureRule
    index: int | None
    """Its place in runPolicy.failureRules; None for one of restartPolicy's rules, which follow them."""
    failure: WorkerFailure

    def describe(self) -> str:
        """E.g. failureRules[1] (RestartGangIgnoringBackoff on exit code 143)."""
        rule, failure = self.rule, self.failure
        on = []
        if rule.on_exit_codes is not None:
            on.append(f"exit code {failure.exit_code}")
        if rule.on_reasons is not None:
            reasons = failure_reasons(failure)
            on.append(f"reason {next(r for r in rule.on_reasons if r in reasons)}")
        if rule.on_termination_message is not None:
            pattern = rule.on_termination_message
            if len(pattern) > MAX_PATTERN_ECHO_CHARS:
                pattern = pattern[: MAX_PATTERN_ECHO_CHARS - 3] + "..."
            on.append(f"termination message /{pattern}/")
        return f"failureRules[{self.index}] ({rule.action} on {' and '.join(on) or 'any failure'})"


def first_match(policy: RunPolicy, failures: Sequence[WorkerFailure]) -> RuleMatch:
    """The first rule, of runPolicy.failureRules and then restartPolicy's, that matches one of the failures."""
    listed: list[tuple[int | None, FailureRule]] = [*enumerate(policy.failure_rules)]
    listed += [(None, rule) for rule in restart_policy_rules(policy.restart_policy)]
    for index, rule in listed:
        for failure in failures:
            if rule_matches(rule, failure):
                return RuleMatch(rule, index, failure)
    raise ValueError("first_match needs at least one failure")  # restartPolicy's last rule matches any


def is_retryable(policy: RunPolicy, failure: WorkerFailure) -> bool:
    """Whether the job's rules (failureRules, then restartPolicy's) would restart the gang for this failure."""
    return first_match(policy, [failure]).rule.action != failure_rules.ACTION_FAIL_JOB


# Kubernetes reports when a container finished to the second: failures this close together
# cannot be ordered, and each may be the cause.
SAME_MOMENT_SECONDS = 1.0


def root_causes(failures: Sequence[WorkerFailure]) -> list[WorkerFailure]:
    """The failures that came first, every worker that was lost, and every trainer that found its settings wrong.

    When one rank dies, its peers fail moments later with errors of their own (a broken
    connection, exit code 1): consequences, not causes. Without a finish time for every
    failure they cannot be told apart, and all count. A worker that was lost (evicted,
    deleted, its node gone: no exit code) is a cause whatever its time: its peers see the
    loss at once, while its pod is only marked once the node is found gone, much later. So is
    a trainer's InvalidTrainerConfig: no peer's failure makes a setting wrong.
    """
    timed = [(f, f.finished_at) for f in failures if f.finished_at is not None]
    if len(timed) < len(failures):
        return list(failures)
    first = min(t for _, t in timed)
    return [
        f
        for f, t in timed
        if f.exit_code is None or is_invalid_trainer_config(f) or (t - first).total_seconds() <= SAME_MOMENT_SECONDS
    ]


def decide_on_failure(policy: RunPolicy, failures: Sequence[WorkerFailure], restarts: int) -> FailureDecision:
    """Restart the gang or fail the job, given the failed workers and the restarts so far.

    A Kueue eviction is no failure: the gang is queued again. Otherwise the first rule that matches one
    of the root causes decides: runPolicy.failureRules in order, then restartPolicy's own rules.
    """
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
            count="evictions",
        )
    summary = "; ".join(f.describe() for f in ordered)
    match = first_match(policy, root_causes(ordered))
    if match.index is None:
        return _by_restart_policy(policy, match, summary, restarts)
    by = f"{match.describe()} decided: "
    if match.rule.action == failure_rules.ACTION_FAIL_JOB:
        return FailureDecision(False, REASON_FAILED_BY_RULE, f"{by}{summary}")
    strategy, rule_name = match.rule.restart_strategy, f"failureRules[{match.index}]"
    if match.rule.action == failure_rules.ACTION_RESTART_IGNORING_BACKOFF:
        return FailureDecision(
            True,
            REASON_WORKER_FAILED,
            f"{by}{summary}; restarting the gang from the last checkpoint (not counted against backoffLimit)",
            count="restartsIgnoringBackoff",
            strategy=strategy,
            rule_name=rule_name,
        )
    return dataclasses.replace(_restart(policy, f"{by}{summary}", restarts), strategy=strategy, rule_name=rule_name)


def _by_restart_policy(policy: RunPolicy, match: RuleMatch, summary: str, restarts: int) -> FailureDecision:
    """What restartPolicy's rules decided, in the words each policy has always used."""
    if match.rule.action != failure_rules.ACTION_FAIL_JOB:
        return _restart(policy, summary, restarts)
    if match.rule.on_reasons == [REASON_INVALID_TRAINER_CONFIG]:
        # No restart can cure it: fail now, with the trainer's own words.
        failure = match.failure
        error = trainer_error(failure.message) or f"exit code {failure.exit_code}"
        return FailureDecision(
            False,
            REASON_INVALID_TRAINER_CONFIG,
            f"worker {failure.rank}: {error} (the trainer's settings are wrong and a restart cannot cure that: "
            "fix the spec and create the job again)",
        )
    if policy.restart_policy == "Never":
        return FailureDecision(False, REASON_RESTART_POLICY_NEVER, f"{summary} (restartPolicy is Never)")
    return FailureDecision(
        False,
        REASON_NON_RETRYABLE_EXIT,
        f"{summary} (restartPolicy ExitCode: codes 1-127 are errors of the program and are not retried)",
    )


def _restart(policy: RunPolicy, what: str, restarts: int) -> FailureDecision:
    """A restart that counts against backoffLimit, or the job's end once it is spent."""
    if restarts >= policy.backoff_limit:
        return FailureDecision(
            False,
            REASON_BACKOFF_LIMIT,
            f"{what} (gang restarted {restarts} time(s), backoffLimit is {policy.backoff_limit})",
        )
    return FailureDecision(
        True,
        REASON_WORKER_FAILED,
        f"{what}; restarting the gang from the last checkpoint ({restarts + 1}/{policy.backoff_limit})",
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
