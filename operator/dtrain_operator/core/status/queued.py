"""Queued: the gang of a job in a Kueue LocalQueue waits for Kueue to admit it (core.queueing)."""

from __future__ import annotations

from dtrain_operator.core import queueing
from dtrain_operator.core.status.computation import StatusComputation


def report_queue(c: StatusComputation) -> None:
    """While Kueue holds a pod of the gang, the job is Queued, and its condition names the queues and Kueue's
    reason; once Kueue lifts the gates, the condition says the gang was admitted."""
    local_queue = queueing.queue_name(c.running_job)
    if local_queue is None:
        return
    queue = c.observed.queue
    if any(p.queued and not p.kueue_managed for p in c.gang.values()):
        c.conditions.set(queueing.NOT_HONORED_CONDITION, True, queueing.REASON_NOT_MANAGED,
                         queueing.not_honored_message(local_queue, c.running_job.namespace))
    elif c.gang and c.conditions.is_true(queueing.NOT_HONORED_CONDITION):
        c.conditions.clear(queueing.NOT_HONORED_CONDITION, queueing.REASON_MANAGED, "Kueue took the gang's pods in")
    if any(p.queued for p in c.gang.values()):
        c.status.phase = "Queued"
        c.conditions.set(queueing.CONDITION, True, queueing.REASON_WAITING, queueing.waiting_message(queue, local_queue))
    elif c.conditions.is_true(queueing.CONDITION):
        where = f"ClusterQueue {queue.cluster_queue}" if queue is not None and queue.cluster_queue else f"LocalQueue {local_queue}"
        c.conditions.clear(queueing.CONDITION, queueing.REASON_ADMITTED, f"Kueue admitted the gang ({where})")
