"""The status of a job the operator cannot run (Failed/InvalidSpec) or whose status it cannot read in full
(StatusUnreadable): nothing is computed from either.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from dtrain_operator.api import (
    DistributedTrainingStatus,
)
from dtrain_operator.core.observation import format_time
from dtrain_operator.core.status.conditions import (
    FAILED,
    REASON_INVALID_SPEC,
    REASON_UNREADABLE_STATUS,
    STATUS_UNREADABLE,
    Conditions,
)


def unreadable_status(
    read: DistributedTrainingStatus, problems: Sequence[str], now: datetime
) -> DistributedTrainingStatus:
    """The status as read, with a StatusUnreadable condition naming what the operator could not read.

    The operator does not act on a status it cannot read in full: it leaves the job's pods
    alone, and what it decided (the status's readable fields) stays as it was.
    """
    status = read.model_copy(deep=True)
    conditions = Conditions(status.conditions, now)
    how = " (kubectl patch --subresource=status)" if any(p.startswith("status") for p in problems) else ""
    conditions.set(
        STATUS_UNREADABLE,
        True,
        REASON_UNREADABLE_STATUS,
        f"the operator cannot read {'; '.join(problems)}. It leaves the job's pods alone until it can: "
        f"fix or remove what it names{how}",
    )
    status.conditions = conditions.items()
    return status


def invalid_status(
    previous: DistributedTrainingStatus | None, errors: Sequence[str], generation: int | None, now: datetime
) -> DistributedTrainingStatus:
    """Failed/InvalidSpec with the validation messages, for an object that does not validate.

    A job that was already accepted keeps running its accepted spec, so this applies only to
    objects the operator never accepted.
    """
    status = (previous or DistributedTrainingStatus()).model_copy(deep=True)
    conditions = Conditions(status.conditions, now)
    message = "the spec is invalid: " + "; ".join(errors) + ". Fix the spec (see `dtrain validate`)"
    conditions.set(FAILED, True, REASON_INVALID_SPEC, message)
    status.phase = "Failed"
    status.observed_generation = generation
    if status.completion_time is None:
        status.completion_time = format_time(now)
    status.conditions = conditions.items()
    return status
