"""A gang past its progress deadline: where the hang sits (core.hang_diagnosis), named with the pods and nodes
the operator itself observed, in the decision's message (the Restarting or Failed condition and its Event)
and in status.lastHang."""

from __future__ import annotations

from datetime import datetime

from dtrain_operator.api import DistributedTrainingSpec, DistributedTrainingStatus, LastHang
from dtrain_operator.api.stacks import format_ranks
from dtrain_operator.core import elastic, hang_diagnosis, progress_deadline
from dtrain_operator.core.observation import PodObservation, format_time
from dtrain_operator.core.policy import FailureDecision


def pod_and_node(gang: dict[int, PodObservation], devices_per_node: int, rank: int) -> str:
    """A global rank's pod and node: torchrun gives each pod devicesPerNode consecutive ranks."""
    pod = gang.get(rank // devices_per_node)
    if pod is None:
        return f"node rank {rank // devices_per_node}, no pod"
    return f"pod {pod.name}" + (f" on node {pod.node}" if pod.node else "")


def past_progress_deadline(
    spec: DistributedTrainingSpec,
    watch: progress_deadline.ProgressWatch | None,
    status: DistributedTrainingStatus,
    gang: dict[int, PodObservation],
    now: datetime,
) -> FailureDecision | None:
    """The progress deadline's decision (core.progress_deadline) with where the hang sits; status.lastHang records it."""
    decision = progress_deadline.decide(spec.run_policy, watch, now, status.restarts)
    if decision is None:
        return None
    stacks = hang_diagnosis.current_stacks(status.hang_stacks, status.progress, status.gang_generation)
    world_size = elastic.gang_nodes(spec, status) * spec.devices_per_node  # an elastic gang's ranks now
    diagnosis = hang_diagnosis.diagnose(stacks, world_size, lambda rank: pod_and_node(gang, spec.devices_per_node, rank))
    status.last_hang = LastHang(
        time=format_time(now),
        step=stacks.step if stacks is not None else (status.progress.step if status.progress else None),
        ranks=format_ranks(diagnosis.named),
        message=diagnosis.message,
        dumps=diagnosis.dumps,
    )
    return hang_diagnosis.explained(decision, diagnosis)
