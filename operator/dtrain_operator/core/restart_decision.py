"""Whether a gang restarts, and what the restart counts against: one order of the rules, for the operator
(core/status/compute.py) and `dtrain run` (local/run.py).

A failed gang: an elastic gang's nodes lost (core.elastic: a restart that counts against nothing; the gang
shrinks if they stay gone), else the failure rules (core.policy: exit codes, evictions, backoffLimit). A gang
that failed nowhere: the progress deadline (core.progress_deadline), asked only then, as it records the hang.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dtrain_operator.api import DistributedTrainingSpec
from dtrain_operator.core import elastic, policy


def decide(
    spec: DistributedTrainingSpec,
    failures: Sequence[policy.WorkerFailure],
    restarts: int,
    hang: Callable[[], policy.FailureDecision | None],
) -> policy.FailureDecision | None:
    """The gang's restart or end (None: it goes on). `hang` is the progress deadline's decision."""
    if failures:
        return elastic.node_loss_restart(spec, failures) or policy.decide_on_failure(spec.run_policy, failures, restarts)
    return hang()
