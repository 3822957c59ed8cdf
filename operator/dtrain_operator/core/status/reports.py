"""The steps of compute_status that report on a running gang without deciding anything: stragglers, missed
checkpoints, pods pending past the schedule timeout."""

from __future__ import annotations

from dtrain_operator.core import stragglers
from dtrain_operator.core.gang_state import pods_pending_too_long
from dtrain_operator.core.status import storage_conditions
from dtrain_operator.core.status.computation import StatusComputation
from dtrain_operator.core.status.conditions import (
    PODS_PENDING,
    REASON_PODS_PENDING_TOO_LONG,
    REASON_PODS_STARTED,
)


def report_stragglers(c: StatusComputation) -> None:
    progress = c.status.progress
    straggler = stragglers.straggler_message(progress.step_times if progress else None, c.spec.stragglers,
                                             stragglers.place_in_gang(c.gang, c.spec.devices_per_node))
    if straggler is not None:
        c.conditions.set(stragglers.CONDITION, True, stragglers.REASON_DETECTED, straggler)
    elif c.conditions.is_true(stragglers.CONDITION):
        c.conditions.clear(stragglers.CONDITION, stragglers.REASON_NONE, "no rank is slower than the others now")


def report_missed_checkpoints(c: StatusComputation) -> None:
    missed = storage_conditions.missed_message(c.status)
    if missed is not None:
        c.conditions.set(storage_conditions.CONDITION, True, storage_conditions.REASON_MISSED, missed)
    elif c.conditions.is_true(storage_conditions.CONDITION):
        c.conditions.clear(storage_conditions.CONDITION, storage_conditions.REASON_WRITTEN, "the newest checkpoint was written")


def report_pending_pods(c: StatusComputation) -> None:
    too_long = pods_pending_too_long(c.running_job, c.gang, c.now)
    if too_long:
        timeout = c.spec.scheduling.gang.schedule_timeout_seconds
        details = "; ".join(f"{p.name}: {p.pending_reason}" for p in too_long)
        c.conditions.set(PODS_PENDING, True, REASON_PODS_PENDING_TOO_LONG, f"Pending for more than {timeout} s: {details}")
    else:
        c.conditions.clear(PODS_PENDING, REASON_PODS_STARTED, "no worker pod is Pending beyond the schedule timeout")
