"""runPolicy.failureRules: the matcher, the decision the first matching rule makes, restartPolicy as the rule
list that follows the user's (the same decisions as before rules existed), and the refusals naming the rule;
the decisions in the operator's status, Events and record: test_failure_rules_status.py."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from dtrain_operator.api import FailureRule, RunPolicy, contract, restart_policy_rules
from dtrain_operator.api.validation import validate_object
from dtrain_operator.core import queueing
from dtrain_operator.core.policy import (
    FailureDecision,
    WorkerFailure,
    decide_on_failure,
    failure_reasons,
    first_match,
    is_invalid_trainer_config,
    is_retryable,
    rule_matches,
    trainer_error,
)
from tests.unit.test_api import with_spec

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
INVALID = contract.TRAINER_EXIT_INVALID_CONFIG


def exited(code: int, rank: int = 0, reason: str = "Error", message: str = "", at: float | None = None) -> WorkerFailure:
    return WorkerFailure(rank, code, reason, message, None if at is None else T0 + timedelta(seconds=at))


def lost(reason: str, rank: int = 0, message: str = "", at: float | None = None) -> WorkerFailure:
    return WorkerFailure(rank, None, reason, message, None if at is None else T0 + timedelta(seconds=at))


def rule(action: str = "RestartGang", **conditions: Any) -> FailureRule:
    return FailureRule.model_validate({"action": action, **conditions})


def with_rules(*rules: dict[str, Any], **policy: Any) -> RunPolicy:
    return RunPolicy.model_validate({"failureRules": list(rules), **policy})


# --- The matcher ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conditions,failure,matches",
    [
        ({}, exited(1), True),  # no condition: any failure
        ({}, lost("Evicted"), True),
        ({"onExitCodes": [3]}, exited(3), True),
        ({"onExitCodes": [3]}, exited(4), False),
        ({"onExitCodes": ["130-140"]}, exited(130), True),
        ({"onExitCodes": ["130-140"]}, exited(140), True),
        ({"onExitCodes": ["130-140"]}, exited(129), False),
        ({"onExitCodes": ["130-140"]}, exited(141), False),
        ({"onExitCodes": [1, "130-140", "143"]}, exited(143), True),
        ({"onExitCodes": ["0-255"]}, lost("Evicted"), False),  # no exit code: never an exit-code match
        ({"onReasons": ["OOMKilled"]}, exited(137, reason="OOMKilled"), True),
        ({"onReasons": ["OOMKilled"]}, exited(137, reason="Error"), False),
        ({"onReasons": ["Evicted"]}, lost("Evicted"), True),
        ({"onReasons": ["Evicted"]}, lost("EvictionByEvictionAPI"), True),  # a drain
        ({"onReasons": ["Preempted"]}, lost("PreemptionByScheduler"), True),
        ({"onReasons": ["Preempted"]}, lost("Preempting"), True),
        ({"onReasons": ["PreemptionByScheduler"]}, lost("PreemptionByScheduler"), True),
        ({"onReasons": ["Preempted"]}, lost("Evicted"), False),
        ({"onReasons": ["Lost"]}, lost("Deleted"), True),
        ({"onReasons": ["Lost"]}, exited(137), False),
        ({"onReasons": ["DeadlineExceeded"]}, lost("DeadlineExceeded"), True),
        ({"onReasons": ["InvalidTrainerConfig"]}, exited(INVALID), True),
        ({"onReasons": ["InvalidTrainerConfig"]}, exited(1), False),
        # RE2, found anywhere in the message (as CEL's matches()).
        ({"onTerminationMessage": "illegal memory access"}, exited(1, message="CUDA error: an illegal memory access"), True),
        ({"onTerminationMessage": "^CUDA"}, exited(1, message="RuntimeError: CUDA error"), False),
        ({"onTerminationMessage": "(?i)nccl.*timeout"}, exited(1, message="NCCL watchdog: Timeout after 600 s"), True),
        ({"onTerminationMessage": r"\pL+ error"}, exited(1, message="Ünïcode error"), True),
        ({"onTerminationMessage": "low on resource"}, lost("Evicted", message="The node was low on resource: memory."), True),
        ({"onTerminationMessage": "anything"}, exited(1), False),
        # Every condition given must hold.
        ({"onExitCodes": [1], "onTerminationMessage": "CUDA"}, exited(1, message="CUDA error"), True),
        ({"onExitCodes": [1], "onTerminationMessage": "CUDA"}, exited(2, message="CUDA error"), False),
        ({"onExitCodes": [1], "onTerminationMessage": "CUDA"}, exited(1, message="ValueError"), False),
        ({"onExitCodes": [137], "onReasons": ["OOMKilled"]}, exited(137, reason="Error"), False),
    ],
)
def test_a_rule_matches_when_every_condition_holds(conditions, failure, matches):
    assert rule_matches(rule(**conditions), failure) is matches


def test_the_message_is_matched_whole_though_a_decision_quotes_only_its_end():
    """A 4 KiB termination message: a pattern finds its first line; the condition quotes its last 400 characters."""
    message = "NCCL error: unhandled system error\n" + "x" * 4000 + "\nend of log"
    failure = exited(1, message=message)
    assert rule_matches(rule(onTerminationMessage="unhandled system error"), failure)
    assert failure.describe().endswith("end of log") and len(failure.describe()) < 500


def test_failure_reasons_name_what_kubernetes_reports_and_dtrains_names_for_it():
    assert failure_reasons(lost("PreemptionByScheduler")) == {"PreemptionByScheduler", "Preempted", "Lost"}
    assert failure_reasons(exited(INVALID)) == {"Error", "InvalidTrainerConfig"}
    assert failure_reasons(exited(137, reason="OOMKilled")) == {"OOMKilled"}


# --- First match wins -----------------------------------------------------------------------------


def test_the_first_rule_that_matches_decides():
    policy = with_rules(
        {"action": "FailJob", "onExitCodes": [4]},
        {"action": "RestartGangIgnoringBackoff", "onExitCodes": ["130-140", 143]},
        {"action": "FailJob", "onExitCodes": [143]},  # never reached for 143
    )
    decision = decide_on_failure(policy, [exited(143, rank=1)], restarts=0)
    assert (decision.restart, decision.count) == (True, "restartsIgnoringBackoff")
    assert decision.message.startswith(
        "failureRules[1] (RestartGangIgnoringBackoff on exit code 143) decided: worker 1 exited with code 143; "
        "restarting the gang from the last checkpoint (not counted against backoffLimit)"
    )


def test_rules_are_tried_in_order_over_all_failures_before_the_next_rule():
    """Two workers failed at the same moment: the first rule that matches either decides, whichever rank."""
    policy = with_rules({"action": "FailJob", "onReasons": ["OOMKilled"]}, {"action": "RestartGang"})
    failures = [exited(1, rank=0, at=0), exited(137, rank=1, reason="OOMKilled", at=0.5)]
    match = first_match(policy, failures)
    assert (match.index, match.failure.rank) == (0, 1)
    decision = decide_on_failure(policy, failures, restarts=0)
    assert (decision.restart, decision.reason) == (False, "FailedByRule")
    assert decision.message == (
        "failureRules[0] (FailJob on reason OOMKilled) decided: worker 0 exited with code 1; "
        "worker 1 exited with code 137 (OOMKilled)"
    )


def test_a_peers_error_after_the_cause_is_not_matched():
    """Rank 1 was killed; rank 0 failed 4 s later on the broken connection: only the kill is matched."""
    policy = with_rules({"action": "FailJob", "onExitCodes": [1]}, restart_policy="ExitCode")
    decision = decide_on_failure(policy, [exited(137, rank=1, at=0), exited(1, rank=0, at=4)], restarts=0)
    assert (decision.restart, decision.reason) == (True, "WorkerFailed")
    assert "failureRules" not in decision.message


def test_restart_gang_counts_against_the_backoff_limit_and_names_the_rule_when_it_is_spent():
    policy = with_rules({"action": "RestartGang", "onExitCodes": [3]}, restart_policy="ExitCode", backoff_limit=2)
    restarted = decide_on_failure(policy, [exited(3, rank=1)], restarts=1)
    assert (restarted.restart, restarted.count, restarted.reason) == (True, "restarts", "WorkerFailed")
    assert restarted.message == ("failureRules[0] (RestartGang on exit code 3) decided: worker 1 exited with code 3; "
                                 "restarting the gang from the last checkpoint (2/2)")
    spent = decide_on_failure(policy, [exited(3, rank=1)], restarts=2)
    assert (spent.restart, spent.reason) == (False, "BackoffLimitExceeded")
    assert spent.message == ("failureRules[0] (RestartGang on exit code 3) decided: worker 1 exited with code 3 "
                             "(gang restarted 2 time(s), backoffLimit is 2)")
    # Without the rule, ExitCode fails exit code 3 at once.
    assert decide_on_failure(RunPolicy(restart_policy="ExitCode"), [exited(3)], 0).reason == "NonRetryableExitCode"


def test_restart_ignoring_backoff_restarts_past_the_backoff_limit():
    policy = with_rules({"action": "RestartGangIgnoringBackoff", "onReasons": ["Preempted"]}, backoff_limit=0)
    decision = decide_on_failure(policy, [lost("PreemptionByScheduler", message="preempted by team-b/big")], restarts=0)
    assert (decision.restart, decision.counted, decision.count) == (True, False, "restartsIgnoringBackoff")
    assert decision.message.startswith(
        "failureRules[0] (RestartGangIgnoringBackoff on reason Preempted) decided: worker 0 was lost "
        "(PreemptionByScheduler): preempted by team-b/big"
    )
    # Any other failure is restartPolicy's (OnFailure): counted, and the limit of 0 is spent.
    assert decide_on_failure(policy, [exited(1)], restarts=0).reason == "BackoffLimitExceeded"


def test_a_rule_on_the_termination_message_names_its_pattern():
    long_pattern = "CUDA error: (an illegal memory access|unspecified launch failure)"
    policy = with_rules({"action": "RestartGangIgnoringBackoff", "onExitCodes": [1], "onTerminationMessage": long_pattern},
                        restart_policy="Never")
    decision = decide_on_failure(policy, [exited(1, message="RuntimeError: CUDA error: an illegal memory access")], 0)
    assert decision.restart
    assert decision.message.startswith(
        "failureRules[0] (RestartGangIgnoringBackoff on exit code 1 and termination message "
        "/CUDA error: (an illegal memory access.../) decided: worker 0 exited with code 1: RuntimeError"
    )


def test_a_fail_job_rule_fails_what_restart_policy_would_restart():
    policy = with_rules({"action": "FailJob", "onTerminationMessage": "corrupt image"})
    decision = decide_on_failure(policy, [exited(1, message="OSError: corrupt image data/x.jpg")], restarts=0)
    assert (decision.restart, decision.reason) == (False, "FailedByRule")
    assert decision.ending.reason == "FailedByRule"


def test_a_rule_may_restart_what_restart_policy_calls_an_invalid_config():
    """An object store that was down at the start made the checkpoint dir unusable (exit 78): the user's rule
    comes first and restarts; without it, InvalidTrainerConfig fails the job at once."""
    failure = exited(INVALID, message='{"ok":false,"error":"checkpoint.dir s3://ckpt: endpoint unreachable"}')
    policy = with_rules({"action": "RestartGang", "onReasons": ["InvalidTrainerConfig"],
                         "onTerminationMessage": "endpoint unreachable"})
    assert decide_on_failure(policy, [failure], restarts=0).restart
    assert decide_on_failure(RunPolicy(), [failure], restarts=0).reason == "InvalidTrainerConfig"


def test_a_kueue_eviction_is_no_failure_whatever_the_rules_say():
    policy = with_rules({"action": "FailJob"})
    stopped = lost(f"{queueing.EVICTED_REASON}ByPreemption", message="preempted")
    decision = decide_on_failure(policy, [stopped], restarts=0)
    assert (decision.restart, decision.count) == (True, "evictions")


def test_an_invalid_config_is_a_cause_whenever_it_came():
    """The trainer's exit 78 four seconds after a peer was killed: no kill makes a setting wrong."""
    failures = [exited(137, rank=0, at=0), exited(INVALID, rank=1, at=4, message='{"error":"model.classPath: no"}')]
    decision = decide_on_failure(RunPolicy(), failures, restarts=0)
    assert (decision.restart, decision.reason) == (False, "InvalidTrainerConfig")


# --- restartPolicy is the rule list after the user's: the decisions of before ---------------------


def test_restart_policy_rules_are_the_documented_lists():
    wire = {p: [r.model_dump(by_alias=True, exclude_none=True) for r in restart_policy_rules(p)]
            for p in ("OnFailure", "ExitCode", "Never")}
    invalid = {"action": "FailJob", "onReasons": ["InvalidTrainerConfig"]}
    assert wire == {
        "OnFailure": [invalid, {"action": "RestartGang"}],
        "ExitCode": [invalid, {"action": "RestartGang", "onExitCodes": ["128-255"]},
                     {"action": "RestartGang", "onReasons": ["Lost"]}, {"action": "FailJob"}],
        "Never": [invalid, {"action": "FailJob"}],
    }
    # The field's documentation states the same lists.
    doc = RunPolicy.model_fields["failure_rules"].description or ""
    assert ('ExitCode is [{action: FailJob, onReasons: [InvalidTrainerConfig]}, {action: RestartGang, onExitCodes: '
            '["128-255"]}, {action: RestartGang, onReasons: [Lost]}, {action: FailJob}]') in doc


def _decide_before_rules(policy: RunPolicy, failures: Sequence[WorkerFailure], restarts: int) -> FailureDecision:
    """core.policy.decide_on_failure as it was before failure rules (commit 93c06e7), less Kueue's evictions."""
    ordered = sorted(failures, key=lambda f: f.rank)
    invalid = [f for f in ordered if is_invalid_trainer_config(f)]
    if invalid:
        first = invalid[0]
        error = trainer_error(first.message) or f"exit code {first.exit_code}"
        return FailureDecision(False, "InvalidTrainerConfig", f"worker {first.rank}: {error} (the trainer's settings "
                               "are wrong and a restart cannot cure that: fix the spec and create the job again)")
    summary = "; ".join(f.describe() for f in ordered)
    if policy.restart_policy == "Never":
        return FailureDecision(False, "RestartPolicyNever", f"{summary} (restartPolicy is Never)")

    def retryable(f: WorkerFailure) -> bool:
        return policy.restart_policy == "OnFailure" or f.exit_code is None or f.exit_code >= 128

    timed = [(f, f.finished_at) for f in ordered if f.finished_at is not None]
    if len(timed) < len(ordered):
        causes = list(ordered)
    else:
        first_at = min(t for _, t in timed)
        causes = [f for f, t in timed if f.exit_code is None or (t - first_at).total_seconds() <= 1.0]
    if not any(retryable(f) for f in causes):
        return FailureDecision(False, "NonRetryableExitCode", f"{summary} (restartPolicy ExitCode: codes 1-127 are "
                               "errors of the program and are not retried)")
    if restarts >= policy.backoff_limit:
        return FailureDecision(False, "BackoffLimitExceeded", f"{summary} (gang restarted {restarts} time(s), "
                               f"backoffLimit is {policy.backoff_limit})")
    return FailureDecision(True, "WorkerFailed", f"{summary}; restarting the gang from the last checkpoint "
                           f"({restarts + 1}/{policy.backoff_limit})")


def _random_failures(rng: random.Random) -> list[WorkerFailure]:
    ranks = rng.sample(range(4), rng.randint(1, 4))
    timed = rng.random() < 0.7
    failures = []
    for rank in ranks:
        at = rng.choice([0, 0.5, 1, 4, 40]) if timed else None
        if rng.random() < 0.25:
            failures.append(lost(rng.choice(["Evicted", "Deleted", "PreemptionByScheduler", "NodeLost"]), rank, "gone", at))
        else:
            code = rng.choice([1, 2, 3, INVALID, 126, 127, 128, 130, 137, 143, 255])
            failures.append(exited(code, rank, rng.choice(["Error", "OOMKilled"]), rng.choice(["", "boom"]), at))
    return failures


@pytest.mark.parametrize("restart_policy", ["OnFailure", "ExitCode", "Never"])
def test_without_rules_restart_policy_decides_as_it_always_did(restart_policy):
    rng = random.Random(f"failure-rules-{restart_policy}")
    for _ in range(600):
        failures = _random_failures(rng)
        policy = RunPolicy(restart_policy=restart_policy, backoff_limit=rng.randint(0, 3))
        restarts = rng.randint(0, 4)
        assert decide_on_failure(policy, failures, restarts) == _decide_before_rules(policy, failures, restarts), failures


@pytest.mark.parametrize("restart_policy", ["OnFailure", "ExitCode", "Never"])
def test_every_exit_code_is_retryable_as_before(restart_policy):
    policy = RunPolicy(restart_policy=restart_policy)
    for code in range(256):
        before = code != INVALID and restart_policy != "Never" and (restart_policy == "OnFailure" or code >= 128)
        assert is_retryable(policy, exited(code)) is before, code
    assert is_retryable(policy, lost("NodeLost")) is (restart_policy != "Never")


# --- Refused, naming the rule ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "rules,line",
    [
        ([{"action": "RestartGang"}, {"action": "FailJob"}, {"action": "FailJob", "onTerminationMessage": "a(?!b)"}],
         ("spec.runPolicy.failureRules[2].onTerminationMessage: not an RE2 regular expression: invalid perl operator: "
         "(?! (got 'a(?!b)')")),
        ([{"action": "FailJob", "onTerminationMessage": r"(x)\1"}],
         ("spec.runPolicy.failureRules[0].onTerminationMessage: not an RE2 regular expression: invalid escape sequence: "
         r"\1")),
        ([{"action": "FailJob", "onTerminationMessage": "x" * 513}],
         "spec.runPolicy.failureRules[0].onTerminationMessage: String should have at most 512 characters"),
        ([{"action": "FailJob", "onExitCodes": []}],
         "spec.runPolicy.failureRules[0].onExitCodes: List should have at least 1 item"),
        ([{"action": "FailJob", "onExitCodes": [1, "140-130"]}],
         "spec.runPolicy.failureRules[0].onExitCodes[1]: a range goes from the lower code to the higher (\"130-140\")"),
        ([{"action": "FailJob", "onExitCodes": [256]}], "spec.runPolicy.failureRules[0].onExitCodes[0]: exit codes are 0-255"),
        ([{"action": "FailJob", "onExitCodes": ["130..140"]}],
         "spec.runPolicy.failureRules[0].onExitCodes[0]: write a code (3) or a range of codes (\"130-140\"), each 0-255"),
        ([{"action": "FailJob", "onReasons": ["OOM Killed"]}],
         "spec.runPolicy.failureRules[0].onReasons[0]: String should match pattern"),
        ([{"onExitCodes": [1]}], "spec.runPolicy.failureRules[0].action: required field is missing"),
        ([{"action": "FailJob", "onExitCode": [1]}], "spec.runPolicy.failureRules[0].onExitCode: unknown field; did you mean"),
        ([{"action": "FailJob"}] * 17, "spec.runPolicy.failureRules: List should have at most 16 items"),
    ],
)
def test_a_bad_rule_is_refused_naming_it(rules, line):
    errors = validate_object(with_spec("runPolicy.failureRules", rules)).errors
    assert any(e.startswith(line) for e in errors), errors


def test_good_rules_are_accepted_and_kept():
    job = validate_object(with_spec("runPolicy.failureRules", [
        {"action": "RestartGangIgnoringBackoff", "onExitCodes": [143, "128-135"], "onReasons": ["Preempted"],
         "onTerminationMessage": r"(?i)nccl\b.*timeout|\pL"},
        {"action": "FailJob"},
    ])).job
    assert job is not None
    first = job.spec.run_policy.failure_rules[0]
    assert first.exit_code_ranges() == ((143, 143), (128, 135))
    assert job.spec.run_policy.to_wire()["failureRules"][0]["onExitCodes"] == [143, "128-135"]
