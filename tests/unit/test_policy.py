"""The restart policy that the operator and `dtrain run` share: a table of failures and decisions."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from dtrain_operator.api import RunPolicy, contract
from dtrain_operator.core.policy import (
    REASON_INVALID_TRAINER_CONFIG,
    Ending,
    WorkerFailure,
    deadline_ending,
    deadline_exceeded,
    decide_on_failure,
    ending_after_training,
    engine_ending,
    is_retryable,
    message_tail,
    trainer_error,
)

EVICTED = WorkerFailure(1, None, "Evicted", "The node was low on resource: memory.")


T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def exited(code: int, rank: int = 0, reason: str = "Error", at: float | None = None) -> WorkerFailure:
    """A worker that exited with `code`, `at` seconds after T0 (None: finish time unknown)."""
    return WorkerFailure(rank, code, reason, finished_at=None if at is None else T0 + timedelta(seconds=at))


@pytest.mark.parametrize(
    "policy,failure,retryable",
    [
        ("OnFailure", exited(1), True),
        ("OnFailure", exited(137), True),
        ("OnFailure", EVICTED, True),
        ("ExitCode", exited(1), False),
        ("ExitCode", exited(2), False),
        ("ExitCode", exited(127), False),
        ("ExitCode", exited(128), True),
        ("ExitCode", exited(137, reason="OOMKilled"), True),
        ("ExitCode", exited(143), True),
        ("ExitCode", EVICTED, True),
        ("Never", exited(137), False),
        ("Never", EVICTED, False),
    ],
)
def test_is_retryable(policy, failure, retryable):
    assert is_retryable(RunPolicy(restart_policy=policy), failure) is retryable


@pytest.mark.parametrize(
    "policy,failures,restarts,restart,reason,message_part",
    [
        (RunPolicy(), [exited(1, rank=2)], 0, True, "WorkerFailed", "worker 2 exited with code 1; restarting the gang"),
        (RunPolicy(), [exited(1)], 2, True, "WorkerFailed", "(3/3)"),
        (RunPolicy(), [exited(1)], 3, False, "BackoffLimitExceeded", "gang restarted 3 time(s), backoffLimit is 3"),
        (RunPolicy(backoff_limit=0), [EVICTED], 0, False, "BackoffLimitExceeded", "worker 1 was lost (Evicted)"),
        (RunPolicy(restart_policy="ExitCode"), [exited(1)], 0, False, "NonRetryableExitCode", "codes 1-127"),
        (RunPolicy(restart_policy="ExitCode"), [exited(137, reason="OOMKilled")], 0, True, "WorkerFailed",
         "exited with code 137 (OOMKilled)"),
        (RunPolicy(restart_policy="ExitCode"), [EVICTED], 0, True, "WorkerFailed", "low on resource"),
        # Failures that cannot be ordered: a kill among them may have caused the program errors.
        (RunPolicy(restart_policy="ExitCode"), [exited(137, rank=1), exited(3, rank=0)], 0, True,
         "WorkerFailed", "worker 0 exited with code 3; worker 1 exited with code 137"),
        # A killed rank, then its peer failing on the broken connection: the kill is the cause.
        (RunPolicy(restart_policy="ExitCode"), [exited(137, rank=1, at=0), exited(1, rank=0, at=4)], 0, True,
         "WorkerFailed", "restarting the gang"),
        # A program error first, its peer killed later: the program error is the cause.
        (RunPolicy(restart_policy="ExitCode"), [exited(3, rank=0, at=0), exited(137, rank=1, at=4)], 0, False,
         "NonRetryableExitCode", "codes 1-127"),
        # Within the same second (Kubernetes' resolution), either may be the cause.
        (RunPolicy(restart_policy="ExitCode"), [exited(1, rank=0, at=0), exited(143, rank=1, at=1)], 0, True,
         "WorkerFailed", "restarting the gang"),
        (RunPolicy(restart_policy="Never"), [EVICTED], 0, False, "RestartPolicyNever", "restartPolicy is Never"),
        # A lost node: its peers exit 1 at once, its pod is marked lost much later. The loss is the cause.
        (RunPolicy(restart_policy="ExitCode"),
         [exited(1, rank=1, at=0), exited(1, rank=2, at=0), replace(EVICTED, rank=0, finished_at=T0 + timedelta(seconds=40))],
         0, True, "WorkerFailed", "worker 0 was lost"),
    ],
)
def test_decide_on_failure(policy, failures, restarts, restart, reason, message_part):
    decision = decide_on_failure(policy, failures, restarts)
    assert (decision.restart, decision.reason) == (restart, reason)
    assert message_part in decision.message


def test_decide_needs_a_failure():
    with pytest.raises(ValueError):
        decide_on_failure(RunPolicy(), [], 0)


START = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "deadline,started,elapsed,exceeded",
    [
        (None, START, 10_000, False),
        (60, None, 10_000, False),
        (60, START, 59, False),
        (60, START, 60, False),
        (60, START, 61, True),
    ],
)
def test_deadline_exceeded(deadline, started, elapsed, exceeded):
    policy = RunPolicy(active_deadline_seconds=deadline)
    assert deadline_exceeded(policy, started, START + timedelta(seconds=elapsed)) is exceeded


@pytest.mark.parametrize("restart_policy", ["OnFailure", "ExitCode", "Never"])
def test_an_invalid_trainer_config_fails_at_once_under_every_restart_policy(restart_policy: str) -> None:
    # The pod's termination message is the trainer's JSON results, naming the class.
    typo = WorkerFailure(
        0,
        contract.TRAINER_EXIT_INVALID_CONFIG,
        "Error",
        '{"ok":false,"error":"model.classPath: module \'mypkg\' has no \'LitModle\'; did you mean mypkg.LitModel?"}',
    )
    # Its peer lost the connection a moment later: a consequence, and a restartable exit.
    peer = WorkerFailure(1, 1, "Error", "connection reset by peer")
    policy = RunPolicy(restart_policy=restart_policy, backoff_limit=5)
    assert not is_retryable(policy, typo)
    decision = decide_on_failure(policy, [peer, typo], restarts=0)
    assert (decision.restart, decision.reason) == (False, REASON_INVALID_TRAINER_CONFIG)
    assert decision.message.startswith("worker 0: model.classPath: module 'mypkg' has no 'LitModle'")
    assert "a restart cannot cure" in decision.message


def test_the_trainers_error_is_read_from_its_results_or_taken_as_it_is() -> None:
    assert trainer_error('{"ok": false, "error": "checkpoint.dir /ckpt is not writable"}') == (
        "checkpoint.dir /ckpt is not writable"
    )
    assert trainer_error("Traceback (most recent call last): ...") == "Traceback (most recent call last): ..."
    assert trainer_error("{not json") == "{not json"


@pytest.mark.parametrize(
    "export_error,engine,ending",
    [
        (None, True, None),  # the engine is next
        (None, False, Ending("Succeeded", "TrainingSucceeded", "training succeeded (engine.enabled is false)")),
        ("no opset", True,
         Ending("Failed", "ExportFailed", "training succeeded but the ONNX export failed, so no engine is built: no opset")),
        ("no opset", False, Ending("Succeeded", "TrainingSucceeded", "training succeeded; the ONNX export failed: no opset")),
    ],
)
def test_after_training_a_failed_export_fails_the_job_only_when_an_engine_was_asked_for(export_error, engine, ending):
    """One rule for the operator's status and `dtrain run`'s summary."""
    assert ending_after_training(export_error, engine) == ending


def test_the_engine_builds_end_and_the_deadline_are_the_jobs_end():
    assert engine_ending(True, "Job j-engine") == Ending("Succeeded", "EngineBuilt", "training succeeded and the engine is built")
    assert engine_ending(False, "Job j-engine", "OOM") == Ending("Failed", "EngineBuildFailed", "Job j-engine failed: OOM")
    assert engine_ending(False, "dtrain build-engine").message == "dtrain build-engine failed"
    ended = deadline_ending(RunPolicy(active_deadline_seconds=60))
    assert (ended.phase, ended.reason) == ("Failed", "DeadlineExceeded") and "(60 s)" in ended.message
    failed = decide_on_failure(RunPolicy(restart_policy="Never"), [exited(1)], restarts=0)
    assert failed.ending == Ending("Failed", failed.reason, failed.message)


TRACEBACK = """[rank0]: Traceback (most recent call last):
  File "/opt/dtrain/trainer_image/dtrain_trainer/runner.py", line 88, in main
    model = build_model(config)
            ^^^^^^^^^^^^^^^^^^^
  File "/opt/dtrain/trainer_image/dtrain_trainer/models.py", line 40, in build_model
    raise ValueError("initArgs.arch: unknown architecture 'resnet19'")
ValueError: initArgs.arch: unknown architecture 'resnet19'
E1206 02:00:00.000000 1 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
dtrain_trainer FAILED
------------------------------------------------------------
"""


def test_a_failure_quotes_the_exceptions_own_line_not_a_traceback_tail() -> None:
    failure = WorkerFailure(0, 1, "Error", TRACEBACK + "  " + "^" * 300 + "\n")
    assert failure.describe() == "worker 0 exited with code 1: ValueError: initArgs.arch: unknown architecture 'resnet19'"
    assert message_tail("no traceback here, just a line") == "no traceback here, just a line"
    assert message_tail("x" * 1000).startswith("...") and len(message_tail("x" * 1000)) == 400
    assert message_tail("RuntimeError: " + "y" * 1000).endswith("...")
