"""`spec.runPolicy.failureRules`: what a failed worker makes of the job, rule by rule, as JobSet's
`failurePolicy.rules` (the first rule that matches decides; core.policy applies them).

A termination-message pattern is an RE2 regular expression, checked and run by RE2 itself
(google-re2) and, at `kubectl apply`, by the API server's CEL (RE2 syntax too): the operator runs
patterns that any user who may create a job wrote, on text a failed program wrote, and RE2 matches
in linear time where a backtracking engine (Python's `re`) can take years on a pattern such as
`(a|a)*b`. RE2 has no look-around and no backreferences, and says so when a pattern uses them.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

import re2
from pydantic import AfterValidator, ConfigDict, Field, StrictInt, StrictStr, WithJsonSchema, model_validator

from dtrain_operator.api.common import ApiModel

FailureAction = Literal["FailJob", "RestartGang", "RestartGangIgnoringBackoff"]
ACTION_FAIL_JOB: FailureAction = "FailJob"
ACTION_RESTART_GANG: FailureAction = "RestartGang"
ACTION_RESTART_IGNORING_BACKOFF: FailureAction = "RestartGangIgnoringBackoff"
RestartStrategy = Literal["InPlace", "Recreate"]
STRATEGY_IN_PLACE: RestartStrategy = "InPlace"
STRATEGY_RECREATE: RestartStrategy = "Recreate"

# A process's exit status on Linux; 128 + n when signal n killed it.
MAX_EXIT_CODE = 255
_CODE = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
EXIT_CODES_PATTERN = rf"^{_CODE}(-{_CODE})?$"
MAX_EXIT_CODES_TEXT = 7  # "128-255"
MAX_EXIT_CODE_ITEMS = 32
# A pod's reason as Kubernetes writes one (a condition's reason: CamelCase), e.g. OOMKilled.
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
MAX_REASON_LENGTH = 128
MAX_REASONS = 16
MAX_MESSAGE_PATTERN_LENGTH = 512
MAX_FAILURE_RULES = 16

# dtrain's names for what Kubernetes reports in several ways (core.policy.failure_reasons).
REASON_LOST = "Lost"
REASON_PREEMPTED = "Preempted"
REASON_EVICTED = "Evicted"
REASON_INVALID_TRAINER_CONFIG = "InvalidTrainerConfig"

# CEL has no "is a regular expression" function. Matching the empty string compiles the pattern (RE2
# syntax in the API server); one that does not compile is an evaluation error, which refuses the
# object with RE2's own words; the rule is true otherwise.
CEL_COMPILES_RULE = "''.matches(self) || !''.matches(self)"
CEL_COMPILES_MESSAGE = "onTerminationMessage must be an RE2 regular expression"
CEL_STRATEGY_RULE = "!has(self.restartStrategy) || self.action != 'FailJob'"
CEL_STRATEGY_MESSAGE = "restartStrategy is for a rule that restarts the gang: remove it from a FailJob rule"


@functools.lru_cache(maxsize=256)
def compile_re2(pattern: str) -> Any:
    """`pattern` compiled by RE2; raises ValueError with RE2's reason when it does not compile."""
    options = re2.Options()
    options.log_errors = False  # the error is raised, not also printed on stderr
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        text = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        raise ValueError(f"not an RE2 regular expression: {text}") from None


def re2_search(pattern: str, text: str) -> bool:
    """Whether `pattern` (RE2, unanchored, as CEL's matches()) matches somewhere in `text`."""
    return compile_re2(pattern).search(text) is not None


def _compiles(pattern: str) -> str:
    compile_re2(pattern)
    return pattern


def exit_code_range(item: int | str) -> tuple[int, int]:
    """An onExitCodes item as an inclusive range: 3 -> (3, 3), "130-140" -> (130, 140)."""
    if isinstance(item, int):
        return item, item
    low, _, high = item.partition("-")
    return int(low), int(high or low)


def _exit_codes_item(item: int | str) -> int | str:
    if isinstance(item, int) and not 0 <= item <= MAX_EXIT_CODE:
        raise ValueError(f"exit codes are 0-{MAX_EXIT_CODE}")
    if isinstance(item, str):
        if len(item) > MAX_EXIT_CODES_TEXT or re2.fullmatch(EXIT_CODES_PATTERN, item) is None:
            raise ValueError(f'write a code (3) or a range of codes ("130-140"), each 0-{MAX_EXIT_CODE}')
        low, high = exit_code_range(item)
        if low > high:
            raise ValueError(f'a range goes from the lower code to the higher ("{high}-{low}")')
    return item


ExitCodes = Annotated[
    StrictInt | StrictStr,
    AfterValidator(_exit_codes_item),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "minimum": 0,
            "maximum": MAX_EXIT_CODE,
            "maxLength": MAX_EXIT_CODES_TEXT,
            "pattern": EXIT_CODES_PATTERN,
        }
    ),
]


class FailureRule(ApiModel):
    """One rule: a failed worker that meets every condition given (none: any failure) gets the action."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": CEL_STRATEGY_RULE, "message": CEL_STRATEGY_MESSAGE},
    ]})

    action: FailureAction
    """FailJob: the job fails at once (reason FailedByRule). RestartGang: the gang restarts from its last checkpoint, counted against backoffLimit (BackoffLimitExceeded once it is spent). RestartGangIgnoringBackoff: the gang restarts, counted in status.restartsIgnoringBackoff and against no limit: keep it for failures that are not the job's fault (a preemption, a flaky node), or a job can restart forever."""
    on_exit_codes: Annotated[list[ExitCodes], Field(min_length=1, max_length=MAX_EXIT_CODE_ITEMS)] | None = None
    """The worker's exit code is one of these: codes (137) and ranges ("130-140"), 0-255; 128 + n is a kill by signal n (137 SIGKILL, 143 SIGTERM). A worker that did not exit by itself (evicted, preempted, deleted, its node lost) has no exit code and never matches."""
    on_reasons: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=MAX_REASON_LENGTH, pattern=REASON_PATTERN)]],
        Field(min_length=1, max_length=MAX_REASONS),
    ] | None = None
    """The worker's failure reason is one of these: the pod's or its container's, as Kubernetes reports it (OOMKilled, Error, Evicted, DeadlineExceeded, NodeLost, PreemptionByScheduler, Deleted, ...), or one of dtrain's names that cover several: Preempted (PreemptionByScheduler, Preempting), Evicted (also EvictionByEvictionAPI: a drain), Lost (any worker that did not exit by itself), InvalidTrainerConfig (the trainer's exit code 78: a classPath, initArgs, checkpoint directory or export that cannot work)."""
    on_termination_message: Annotated[
        str,
        Field(
            min_length=1,
            max_length=MAX_MESSAGE_PATTERN_LENGTH,
            json_schema_extra={"x-kubernetes-validations": [{"rule": CEL_COMPILES_RULE, "message": CEL_COMPILES_MESSAGE}]},
        ),
        AfterValidator(_compiles),
    ] | None = None
    """An RE2 regular expression found somewhere in the worker's termination message: what its trainer wrote to /dev/termination-log (its JSON results, with the error of a failed run), else the last lines of its log (at most 80 lines and 2 KiB, terminationMessagePolicy FallbackToLogsOnError); for a worker that did not exit by itself, the pod's status message (e.g. "The node was low on resource: memory."). E.g. "CUDA error: an illegal memory access" or "(?i)nccl.*timeout"."""

    restart_strategy: RestartStrategy | None = None
    """With a restart action: how the gang restarts when this rule decides, instead of runPolicy.restartStrategy (e.g. Recreate for an exit that a fresh pod on another node may cure)."""

    @model_validator(mode="after")
    def _strategy_restarts(self) -> FailureRule:
        if self.restart_strategy is not None and self.action == ACTION_FAIL_JOB:
            raise ValueError(CEL_STRATEGY_MESSAGE)
        return self

    def exit_code_ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple(exit_code_range(item) for item in self.on_exit_codes or ())


def restart_policy_rules(restart_policy: str) -> list[FailureRule]:
    """runPolicy.restartPolicy as a rule list: the rules that come after the user's failureRules."""
    invalid_config = FailureRule(action=ACTION_FAIL_JOB, on_reasons=[REASON_INVALID_TRAINER_CONFIG])
    if restart_policy == "Never":
        return [invalid_config, FailureRule(action=ACTION_FAIL_JOB)]
    if restart_policy == "ExitCode":
        return [
            invalid_config,
            FailureRule(action=ACTION_RESTART_GANG, on_exit_codes=[f"128-{MAX_EXIT_CODE}"]),
            FailureRule(action=ACTION_RESTART_GANG, on_reasons=[REASON_LOST]),
            FailureRule(action=ACTION_FAIL_JOB),
        ]
    return [invalid_config, FailureRule(action=ACTION_RESTART_GANG)]
