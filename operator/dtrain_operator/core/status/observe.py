"""A pod or an engine Job as the API server returns it, reduced to what the operator needs
(core.observation), and the results a container leaves in its termination message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dtrain_operator.api import (
    contract,
)
from dtrain_operator.api.results import read_termination_message
from dtrain_operator.core import queueing
from dtrain_operator.core.engine_job import ENGINE_CONTAINER
from dtrain_operator.core.observation import EngineJobObservation, PodObservation, QueueObservation, parse_time
from dtrain_operator.core.render import TRAINER_CONTAINER

# Pod-level reasons of a pod that the node or the cluster took away (it did not exit by itself).
_LOST_POD_REASONS = frozenset({"Evicted", "Preempting", "NodeLost", "Shutdown", "NodeShutdown", "Terminated"})


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, ValueError, TypeError):
        return None


def _container_status(statuses: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any]:
    for status in statuses:
        if status.get("name") == name:
            return status
    return statuses[0] if statuses else {}


def _pending_reason(status: Mapping[str, Any], container: Mapping[str, Any]) -> str:
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return _join(condition.get("reason") or "Unschedulable", condition.get("message"))
    waiting = (container.get("state") or {}).get("waiting")
    if waiting:
        return _join(waiting.get("reason") or "Waiting", waiting.get("message"))
    return "ContainerCreating" if status.get("conditions") else "Unscheduled"


def _join(reason: str, message: str | None) -> str:
    return f"{reason}: {message}" if message else reason


def controller_uid(meta: Mapping[str, Any]) -> str | None:
    """The uid of the object's controlling owner (its ownerReference with controller: true)."""
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            uid = ref.get("uid")
            return str(uid) if uid is not None else None
    return None


def _why(
    status: Mapping[str, Any],
    terminated: Mapping[str, Any],
    disruption: Mapping[str, Any] | None,
    lost: bool,
    deleting: bool,
) -> tuple[str, str]:
    """A pod's reason and message: for one taken away, who took it and why; for a pod Kueue is stopping, or one
    being deleted by a disruption (a preemption, a drain's eviction) while it runs out its grace period, the
    disruption's; else its container's own."""
    if lost:
        reason = status.get("reason") or (disruption or {}).get("reason") or "Lost"
        return reason, status.get("message") or (disruption or {}).get("message") or ""
    if disruption is not None and (deleting or disruption.get("type") == queueing.STOP_CONDITION):
        return disruption.get("reason") or "", disruption.get("message") or ""
    return terminated.get("reason") or status.get("reason") or "", terminated.get("message") or status.get("message") or ""


def observe_pod(raw: Mapping[str, Any]) -> PodObservation:
    """A pod as the API server returns it, reduced to a PodObservation."""
    meta = raw.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = raw.get("status") or {}
    role = labels.get(contract.LABEL_ROLE, "")
    container = _container_status(
        status.get("containerStatuses") or [], ENGINE_CONTAINER if role == contract.ROLE_ENGINE else TRAINER_CONTAINER
    )
    state = container.get("state") or {}
    terminated = state.get("terminated") or {}
    phase = status.get("phase") or "Pending"
    conditions = status.get("conditions") or []
    stops = ("DisruptionTarget", queueing.STOP_CONDITION)  # Kubernetes' own (eviction, preemption) or Kueue's
    disruption = next((c for c in conditions if c.get("type") in stops and c.get("status") == "True"), None)
    lost = status.get("reason") in _LOST_POD_REASONS or (phase == "Failed" and disruption is not None)
    reason, message = _why(status, terminated, disruption, lost, deleting=bool(meta.get("deletionTimestamp")))
    scheduled = bool((raw.get("spec") or {}).get("nodeName")) or any(
        c.get("type") == "PodScheduled" and c.get("status") == "True" for c in conditions
    )
    return PodObservation(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        resource_version=str(meta.get("resourceVersion", "")),
        role=role,
        rank=_int_label(labels, contract.LABEL_NODE_RANK),
        generation=_int_label(labels, contract.LABEL_GANG_GENERATION),
        phase=phase,
        deleting=bool(meta.get("deletionTimestamp")),
        force_deleted=meta.get("deletionGracePeriodSeconds") == 0 and phase not in ("Succeeded", "Failed"),
        created_at=parse_time(meta.get("creationTimestamp")),
        scheduled=scheduled,
        pending_reason=_pending_reason(status, container) if phase == "Pending" else "",
        exit_code=None if lost else terminated.get("exitCode"),
        reason=reason,
        message=message[-contract.TERMINATION_MESSAGE_MAX_BYTES :],
        lost=lost,
        owner_uid=controller_uid(meta),
        finished_at=parse_time(terminated.get("finishedAt"))
        or parse_time((disruption or {}).get("lastTransitionTime")),
        grace_ends_at=parse_time(meta.get("deletionTimestamp")),
        waiting_reason=str(((state.get("waiting") or {}).get("reason")) or ""),
        scheduled_at=next(
            (
                parse_time(c.get("lastTransitionTime"))
                for c in conditions
                if c.get("type") == "PodScheduled" and c.get("status") == "True"
            ),
            None,
        ),
        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
        queued=any(g.get("name") == queueing.ADMISSION_GATE for g in (raw.get("spec") or {}).get("schedulingGates") or []),
        kueue_managed=(meta.get("labels") or {}).get(queueing.MANAGED_LABEL) == "true",
        last_in_group=(meta.get("annotations") or {}).get(queueing.RETRIABLE_ANNOTATION) == "false",
        node=str((raw.get("spec") or {}).get("nodeName") or ""),
    )


def observe_engine_job(raw: Mapping[str, Any]) -> EngineJobObservation:
    """A batch/v1 Job as the API server returns it, reduced to an EngineJobObservation."""
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    succeeded = failed = False
    reason = message = ""
    finished_at = parse_time(status.get("completionTime"))
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") in ("Complete", "SuccessCriteriaMet"):
            succeeded = True
        elif condition.get("type") in ("Failed", "FailureTarget"):
            failed = True
            reason = condition.get("reason") or "Failed"
            message = condition.get("message") or ""
        else:
            continue
        finished_at = finished_at or parse_time(condition.get("lastTransitionTime"))
    return EngineJobObservation(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        resource_version=str(meta.get("resourceVersion", "")),
        succeeded=succeeded and not failed,
        failed=failed,
        reason=reason,
        message=message,
        deleting=bool(meta.get("deletionTimestamp")),
        owner_uid=controller_uid(meta),
        finished_at=finished_at,
    )


def observe_queue(local_queue: str, workload: Mapping[str, Any], queue: Mapping[str, Any]) -> QueueObservation:
    """Kueue's Workload of the gang and its LocalQueue (empty when not found), reduced to a QueueObservation."""
    status = workload.get("status") or {}
    admission = status.get("admission") or {}
    reserved: Mapping[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "QuotaReserved"), {})
    return QueueObservation(
        local_queue=local_queue,
        cluster_queue=admission.get("clusterQueue") or (queue.get("spec") or {}).get("clusterQueue") or "",
        message="" if reserved.get("status") == "True" else str(reserved.get("message") or ""),
    )


def termination_results(message: str) -> dict[str, Any] | None:
    """The JSON object a trainer or engine container left in its termination message, if it is one."""
    return read_termination_message(message)
