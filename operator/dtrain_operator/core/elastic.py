"""When an elastic gang changes size, and what it says about it: the operator's and `dtrain run`'s one rule. Pure.

A gang shrinks when nodes are lost (pods that cannot be placed for elastic.waitSeconds; a
local node stopped for good) and at least elastic.minNodes are left; it grows back to
spec.nodes when the capacity is there again: on a cluster, once a standby pod of every
missing node is placed (a pod that runs nothing and holds the node's place), at the first
checkpoint after that. Either way it restarts from its last checkpoint with the batch
api.elastic keeps at the new size, and the restart is not counted against
runPolicy.backoffLimit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from dtrain_operator.api import DistributedTrainingSpec, DistributedTrainingStatus
from dtrain_operator.api.elastic import layout_at, wanted_layout
from dtrain_operator.api.reasons import reason
from dtrain_operator.core.observation import PodObservation
from dtrain_operator.core.policy import FailureDecision, WorkerFailure

REASON_NODES_LOST = reason(
    "NodesLost", "an elastic gang's pods could not be placed for elastic.waitSeconds: it trains on with fewer nodes, "
    "the global batch kept (Restarting)", "nothing: it grows back once the nodes return",
)
REASON_CAPACITY_BACK = reason("CapacityBack", "a shrunk elastic gang grows back to spec.nodes (Restarting)")


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


# How a worker pod whose node is gone ends: deleted by the pod garbage collector or the taint manager, or simply
# gone (deleted outright, preempted). In an elastic job the restart that follows is the first half of a resize.
NODE_LOSS_REASONS = frozenset({"Deleted", "DeletionByPodGC", "DeletionByTaintManager", "PreemptionByScheduler"})
REASON_NODE_LOST = reason(
    "NodeLost", "an elastic gang's pods went with their nodes: the gang restarts, not counted against backoffLimit "
    "(Restarting)", "nothing: if the nodes do not return, the gang shrinks after elastic.waitSeconds",
)


def gang_nodes(spec: DistributedTrainingSpec, status: DistributedTrainingStatus) -> int:
    """The nodes the gang runs on: an elastic gang's size now (status.elastic.nodes), else spec.nodes."""
    elastic = status.elastic
    if spec.elastic is None or elastic is None or elastic.nodes is None:
        return spec.nodes
    return elastic.nodes


def node_loss_restart(spec: DistributedTrainingSpec, failures: Sequence[WorkerFailure]) -> FailureDecision | None:
    """An elastic gang whose only failures are pods gone with their nodes restarts without counting against
    backoffLimit: if the nodes do not come back, the pods that replace them wait unplaced and the gang shrinks."""
    if spec.elastic is None or not failures or any(f.reason not in NODE_LOSS_REASONS for f in failures):
        return None
    pods = "; ".join(f.message or f.reason for f in failures)
    return FailureDecision(
        restart=True,
        reason=REASON_NODE_LOST,
        message=f"{pods}: the gang restarts from the last checkpoint (not counted against backoffLimit: the job is "
        f"elastic, and trains on down to {spec.elastic.min_nodes} node(s) if pods cannot be placed for "
        f"{spec.elastic.wait_seconds} s)",
        count="restartsIgnoringBackoff",
    )


def _waiting_for_a_node(pod: PodObservation) -> bool:
    """A pod of the gang that no node has taken yet (one Kueue holds waits for its quota, not for a node)."""
    return (pod.phase == "Pending" and not pod.scheduled and not pod.queued and not pod.deleting
            and pod.created_at is not None)


def _waited(pod: PodObservation, now: datetime) -> float:
    assert pod.created_at is not None
    return (now - pod.created_at).total_seconds()


def unplaced(gang: Mapping[int, PodObservation], wait_seconds: int, now: datetime) -> list[PodObservation]:
    """Pods of the gang no node took within `wait_seconds` of their creation."""
    return [p for _, p in sorted(gang.items()) if _waiting_for_a_node(p) and _waited(p, now) >= wait_seconds]


def seconds_until_unplaced(gang: Mapping[int, PodObservation], wait_seconds: int, now: datetime) -> float | None:
    """Seconds until the next pod of the gang counts as unplaced (None: none will)."""
    waits = [wait_seconds - _waited(p, now) for p in gang.values() if _waiting_for_a_node(p)]
    return min((wait for wait in waits if wait > 0), default=None)


def standby_ranks(spec: DistributedTrainingSpec, status: DistributedTrainingStatus) -> range:
    """The ranks a smaller elastic gang lacks: each has a standby pod, placed where its worker would be."""
    return range(gang_nodes(spec, status), spec.nodes if spec.elastic is not None else 0)


def capacity_back(spec: DistributedTrainingSpec, status: DistributedTrainingStatus, standby: Sequence[PodObservation]) -> bool:
    """Every node a smaller gang lacks could be placed again: a standby pod of each is on a node."""
    placed = {p.rank for p in standby if p.scheduled and not p.deleting}
    wanted = standby_ranks(spec, status)
    return len(wanted) > 0 and all(rank in placed for rank in wanted)
