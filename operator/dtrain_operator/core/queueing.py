"""Kueue: a job labelled with a LocalQueue is queued and admitted as one gang of `nodes` pods (pure).

Kueue has no integration for a DistributedTraining (its integrations are Go code inside Kueue or beside
it), so dtrain uses the one it offers any controller: plain pod groups. Every worker pod carries the job's
queue, a group name and the group's size; Kueue's webhook holds each pod behind a scheduling gate until it
admits the whole group against the ClusterQueue's quota, then lifts the gates. When Kueue evicts the group
(preemption, a lost quota), it marks each pod (condition TerminationTarget) and deletes it: the workers
save a checkpoint on SIGTERM, and the operator creates the gang again, gated, for Kueue to admit again;
that restart is Kueue's, not a failure, and counts against no backoffLimit.
"""

from __future__ import annotations

from collections.abc import Sequence

from dtrain_operator.api import DistributedTraining
from dtrain_operator.api.reasons import condition_type, reason
from dtrain_operator.core.observation import PodObservation, QueueObservation

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
RETRIABLE_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
"""On a pod of a group, "false": the group gets no replacement pods, and Kueue finishes its Workload once none runs."""
MANAGED_LABEL = "kueue.x-k8s.io/managed"
"""The label Kueue's pod webhook sets on a pod it takes in (value "true")."""
WORKLOAD_API = "kueue.x-k8s.io/v1beta2"
STOP_CONDITION = "TerminationTarget"
"""The pod condition Kueue sets before it deletes a pod of an evicted group; its reason is the stop's."""
EVICTED_REASON = "WorkloadEvicted"
"""The start of the reason of a pod of an evicted group (WorkloadEvictedDueToPreempted, ...)."""

CONDITION = condition_type(
    "Queued", "the job waits in its Kueue LocalQueue for admission (its pods are gated); the message quotes Kueue",
    "wait, or free quota in the ClusterQueue (`kubectl get workloads`)",
)
REASON_WAITING = reason("WaitingForAdmission", "Kueue has not admitted the gang yet (Queued)")
REASON_ADMITTED = reason("Admitted", "Kueue admitted the gang; its pods start (Queued False)")
REASON_EVICTED = reason(
    "EvictedByKueue", "Kueue took the gang's quota back (preemption): the gang saved a checkpoint and is queued again, "
    "not counted against backoffLimit (Restarting)",
)
NOT_HONORED_CONDITION = condition_type(
    "QueueNotHonored", "the job names a Kueue LocalQueue but Kueue did not take its pods in: they stay gated, nothing "
    "runs", "have Kueue manage the namespace, or create the job without the kueue.x-k8s.io/queue-name label",
)
REASON_NOT_MANAGED = reason("NotManagedByKueue", "Kueue did not take the gang's pods in (QueueNotHonored)",
                            "have Kueue manage the namespace, or drop the queue label")
REASON_MANAGED = reason("ManagedByKueue", "Kueue took the gang's pods in (QueueNotHonored False)")


def queue_name(job: DistributedTraining) -> str | None:
    """The LocalQueue the job asks for (the label every Kueue integration reads), or None."""
    return (job.metadata.labels or {}).get(QUEUE_LABEL) or None


def group_name(job: DistributedTraining) -> str:
    """The pod group, and so Kueue's Workload: one per job, the same across gang restarts and evictions,
    as Kueue expects of the pods that replace a group's."""
    return job.name


def worker_labels(job: DistributedTraining) -> dict[str, str]:
    queue = queue_name(job)
    if queue is None:
        return {}
    labels = {QUEUE_LABEL: queue, POD_GROUP_LABEL: group_name(job)}
    priority = (job.metadata.labels or {}).get(PRIORITY_CLASS_LABEL)
    if priority:
        labels[PRIORITY_CLASS_LABEL] = priority
    return labels


def worker_annotations(job: DistributedTraining) -> dict[str, str]:
    return {POD_GROUP_TOTAL_ANNOTATION: str(job.spec.nodes)} if queue_name(job) is not None else {}


def worker_scheduling_gates(job: DistributedTraining) -> list[dict[str, str]]:
    """A queued job's workers are created behind Kueue's own admission gate, as its webhook would put them: where
    Kueue does not take them in (not installed, or their namespace not managed), they wait, gated, instead of
    running unqueued, and the job says why (not_honored_message)."""
    return [{"name": ADMISSION_GATE}] if queue_name(job) is not None else []


def pods_to_let_go(job: DistributedTraining, workers: Sequence[PodObservation]) -> tuple[PodObservation, ...]:
    """A queued job that ended (Succeeded or Failed) lets go of its queue: each of its worker pods is marked as the
    last of its group (RETRIABLE_ANNOTATION), so that Kueue finishes the Workload once no pod of it runs, frees
    the ClusterQueue's quota for the next job and lifts its finalizers (a namespace with ended jobs deletes).
    Without the mark Kueue waits for a failed pod's replacement, for ever."""
    if queue_name(job) is None:
        return ()
    return tuple(p for p in workers if not p.last_in_group)


def last_in_group_patch(pod_uid: str) -> dict[str, object]:
    """The merge patch that marks a pod the last of its group (the uid a precondition, as for a relabel)."""
    return {"metadata": {"uid": pod_uid, "annotations": {RETRIABLE_ANNOTATION: "false"}}}


def not_honored_message(local_queue: str, namespace: str) -> str:
    return (
        f"the job asks for Kueue's LocalQueue {local_queue}, but Kueue did not take its pods in (no {MANAGED_LABEL} "
        f"label): Kueue is not installed, or its pod integration does not manage namespace {namespace} "
        "(managedJobsNamespaceSelector). The pods stay gated and nothing runs: have an administrator let Kueue manage "
        f"the namespace, or delete the job and create it without the {QUEUE_LABEL} label"
    )


def waiting_message(queue: QueueObservation | None, local_queue: str) -> str:
    """What a queued job's condition says: where it waits, and Kueue's own words on why."""
    where = f"LocalQueue {local_queue}"
    if queue is not None and queue.cluster_queue:
        where += f" (ClusterQueue {queue.cluster_queue})"
    why = f": {queue.message}" if queue is not None and queue.message else ""
    return f"waiting for Kueue to admit the gang in {where}{why}"


def is_queue_stop(reason: str) -> bool:
    """A pod Kueue stopped (its TerminationTarget reason): the group was evicted, not the pod failing."""
    return reason.startswith(EVICTED_REASON)
