"""An elastic gang's size (spec.elastic): shrink on the nodes that can be placed, grow back once they all can.

The rule is core.elastic's; this step records it in the status: status.elastic, a new gang
generation (counted in restartsIgnoringBackoff, not against backoffLimit), the Restarting
condition with the resize's reason, and status.lastRestart (a resize always recreates the
pods: their torchrun environment names the gang's size).
"""

from __future__ import annotations

from dtrain_operator.api import DistributedTrainingStatus, ElasticStatus, LastRestart
from dtrain_operator.api.failure_rules import STRATEGY_RECREATE
from dtrain_operator.core import elastic, queueing
from dtrain_operator.core.observation import format_time
from dtrain_operator.core.status.computation import StatusComputation
from dtrain_operator.core.status.conditions import (
    PODS_PENDING,
    REASON_GANG_RESIZING,
    RESTARTING,
    RUNNING,
)


def resize_elastic_gang(c: StatusComputation) -> DistributedTrainingStatus | None:
    """Shrink a gang whose pods wait unplaced past elastic.waitSeconds; grow a smaller one back at the first
    checkpoint after a standby pod of every missing node was placed."""
    spec, status = c.spec, c.status
    # Under Kueue the gang's size is the workload Kueue admitted, of nodes pods: it keeps it.
    if spec.elastic is None or queueing.queue_name(c.running_job) is not None:
        return None
    size = status.elastic = status.elastic or ElasticStatus()
    size.nodes, size.wanted_nodes, size.min_nodes = size.nodes or spec.nodes, spec.nodes, spec.elastic.min_nodes
    lost = elastic.unplaced(c.gang, spec.elastic.wait_seconds, c.now)
    if lost:
        why = (
            f"{', '.join(p.name for p in lost)} could not be placed for {spec.elastic.wait_seconds} s "
            f"({lost[0].pending_reason or 'no node takes it'})"
        )
        resize = elastic.after_lost_nodes(spec, size.nodes, len(lost), why)
        return None if resize is None else _resized(c, resize)
    if size.nodes >= spec.nodes:
        size.capacity_back_step = None
        return None
    checkpoint = status.last_checkpoint.step if status.last_checkpoint is not None else None
    if not elastic.capacity_back(spec, status, c.observed.standby):
        size.capacity_back_step = None
    elif size.capacity_back_step is None:
        size.capacity_back_step = checkpoint or 0
    elif c.gang_started and checkpoint is not None and checkpoint > size.capacity_back_step:
        missing = spec.nodes - size.nodes
        why = f"a standby pod of each of the {missing} missing node(s) was placed, and step {checkpoint} is checkpointed"
        resize = elastic.grown_back(spec, size.nodes, why)
        return None if resize is None else _resized(c, resize)
    return None


def _resized(c: StatusComputation, resize: elastic.Resize) -> DistributedTrainingStatus:
    status, now = c.status, format_time(c.now)
    assert status.elastic is not None
    status.restarts_ignoring_backoff += 1
    status.in_place_generation = None
    status.elastic = status.elastic.model_copy(update={
        "nodes": resize.nodes, "resizes": status.elastic.resizes + 1, "last_resize": resize.message,
        "last_resize_time": now, "capacity_back_step": None,
    })
    status.last_restart = LastRestart(
        generation=status.gang_generation, strategy=STRATEGY_RECREATE,
        why="a resize recreates the pods: their launch environment names the gang's size", time=now,
    )
    status.phase = "Restarting"
    c.conditions.set(RESTARTING, True, resize.reason, resize.message)
    c.conditions.set(RUNNING, False, REASON_GANG_RESIZING, f"the gang restarts on {resize.nodes} node(s)")
    c.conditions.clear(PODS_PENDING, REASON_GANG_RESIZING, "the gang restarts on another number of nodes")
    c.count_nodes([], active=True)
    return c.done()
