"""The one order of the restart rules (core.restart_decision), which the operator and `dtrain run` both ask: an
elastic gang's lost nodes, then the failure rules, and the progress deadline only for a gang that failed nowhere."""

from __future__ import annotations

import pytest

from dtrain_operator.core import policy, restart_decision
from dtrain_operator.core.elastic import REASON_NODE_LOST
from dtrain_operator.core.policy import FailureDecision, WorkerFailure
from dtrain_operator.core.progress_deadline import REASON_PROGRESS_DEADLINE
from tests.builders import JobBuilder, a_job

ELASTIC = a_job("e").with_nodes(3).with_backoff_limit(2).with_spec(elastic={"minNodes": 2}, trainer={"batchSize": 8})
FIXED = a_job("f").with_nodes(3).with_backoff_limit(2)
NODE_GONE = WorkerFailure(1, None, "DeletionByTaintManager", "its node is gone")
CRASHED = WorkerFailure(2, 1, "Error", "Traceback ...")
HUNG = FailureDecision(True, REASON_PROGRESS_DEADLINE, "no step for 600 s")


class Hang:
    """The progress deadline's decision, and whether it was asked (it records the hang when it is)."""

    def __init__(self) -> None:
        self.asked = False

    def __call__(self) -> FailureDecision:
        self.asked = True
        return HUNG


@pytest.mark.parametrize(
    ("job", "failures", "restarts", "reason", "count"),
    [
        # An elastic gang's nodes lost: a restart that counts against nothing, backoffLimit spent or not.
        (ELASTIC, [NODE_GONE], 2, REASON_NODE_LOST, "restartsIgnoringBackoff"),
        # Any other failure beside them: the failure rules, and backoffLimit.
        (ELASTIC, [NODE_GONE, CRASHED], 0, "WorkerFailed", "restarts"),
        (ELASTIC, [NODE_GONE, CRASHED], 2, policy.REASON_BACKOFF_LIMIT, "restarts"),
        # Not elastic: a lost node is a failure as any other, against backoffLimit.
        (FIXED, [NODE_GONE], 2, policy.REASON_BACKOFF_LIMIT, "restarts"),
    ],
)
def test_a_failed_gang_is_decided_by_its_lost_nodes_then_the_failure_rules_and_never_as_a_hang(
    job: JobBuilder, failures: list[WorkerFailure], restarts: int, reason: str, count: str
) -> None:
    hang = Hang()
    decision = restart_decision.decide(job.as_model().spec, failures, restarts, hang)
    assert decision is not None and (decision.reason, decision.count) == (reason, count)
    assert not hang.asked


def test_a_gang_that_failed_nowhere_is_the_progress_deadlines() -> None:
    hang = Hang()
    assert restart_decision.decide(ELASTIC.as_model().spec, [], 0, hang) is HUNG and hang.asked
    assert restart_decision.decide(ELASTIC.as_model().spec, [], 0, lambda: None) is None
