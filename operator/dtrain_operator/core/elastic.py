"""When an elastic gang changes size, and what it says about it: the operator's and `dtrain run`'s one rule. Pure.

A gang shrinks when nodes are lost (pods that cannot be placed for elastic.waitSeconds; a
local node stopped for good) and at least elastic.minNodes are left; it grows back to
spec.nodes when the capacity is there again. Either way it restarts from its last checkpoint
with the batch api.elastic keeps at the new size, and the restart is not counted against
runPolicy.backoffLimit.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtrain_operator.api import DistributedTrainingSpec
from dtrain_operator.api.elastic import layout_at, wanted_layout

REASON_NODES_LOST = "NodesLost"
REASON_CAPACITY_BACK = "CapacityBack"


@dataclass(frozen=True)
class Resize:
    """A gang restart on another number of nodes."""

    nodes: int
    reason: str
    message: str


def batch_kept(spec: DistributedTrainingSpec, nodes: int) -> str:
    """How `nodes` nodes keep the job's global batch, in the spec's terms."""
    settings = spec.trainer
    wanted = wanted_layout(settings.batch_size, settings.accumulate_grad_batches, spec.devices_per_node, spec.nodes)
    layout = layout_at(wanted, spec.devices_per_node, nodes)
    assert layout is not None, "the spec's validation keeps every size from minNodes to nodes"
    return (
        f"batchSize {layout.batch_size} per process and accumulateGradBatches {layout.accumulate_grad_batches} "
        f"keep the global batch of {wanted.global_batch}"
    )


def after_lost_nodes(spec: DistributedTrainingSpec, nodes: int, lost: int, why: str) -> Resize | None:
    """The smaller gang that trains on without `lost` of its `nodes` nodes, or None when the job is not
    elastic or fewer than elastic.minNodes would be left (then the usual restart and backoff rules apply)."""
    left = nodes - lost
    if spec.elastic is None or lost < 1 or left < spec.elastic.min_nodes:
        return None
    return Resize(
        left,
        REASON_NODES_LOST,
        f"{why}: training goes on from the last checkpoint on {left} of {spec.nodes} nodes; {batch_kept(spec, left)}",
    )


def grown_back(spec: DistributedTrainingSpec, nodes: int, why: str) -> Resize | None:
    """The whole gang again once a smaller one may grow (None when it is whole)."""
    if spec.elastic is None or nodes >= spec.nodes:
        return None
    return Resize(
        spec.nodes,
        REASON_CAPACITY_BACK,
        f"{why}: the gang grows back from {nodes} to {spec.nodes} nodes from the last checkpoint; "
        f"{batch_kept(spec, spec.nodes)}",
    )
