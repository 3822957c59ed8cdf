"""A job in a Kueue LocalQueue: its pods as one pod group, Queued while Kueue holds them, and an eviction
that restarts the gang without counting against backoffLimit (pure functions; Kueue itself runs in make e2e)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dtrain_operator.core import engine_job, queueing, render
from dtrain_operator.core.child_plan import plan_children
from dtrain_operator.core.gang_state import pods_pending_too_long
from dtrain_operator.core.observation import Observed, QueueObservation
from dtrain_operator.core.status.compute import compute_status
from dtrain_operator.core.status.events import status_events
from dtrain_operator.core.status.observe import observe_pod, observe_queue
from tests.builders import NOW, a_cpu_job, a_gang, a_worker, accepted_status

QUEUED = a_cpu_job().in_namespace("ml").with_nodes(3).with_uid().at_generation(1).in_queue("team-a")
JOB = QUEUED.as_model()


def test_every_worker_carries_the_queue_the_group_and_its_size() -> None:
    for rank in range(3):
        meta = render.render_worker_pod(JOB, rank)["metadata"]
        assert meta["labels"][queueing.QUEUE_LABEL] == "team-a"
        assert meta["labels"][queueing.POD_GROUP_LABEL] == "mnist"
        assert meta["annotations"][queueing.POD_GROUP_TOTAL_ANNOTATION] == "3"
    engine = engine_job.render_engine_job(QUEUED.with_engine().as_model())
    assert queueing.QUEUE_LABEL not in engine["spec"]["template"]["metadata"]["labels"]  # admitted with the gang only
    plain = render.render_worker_pod(a_cpu_job().as_model(), 0)["metadata"]
    assert queueing.QUEUE_LABEL not in plain["labels"] and queueing.POD_GROUP_TOTAL_ANNOTATION not in plain["annotations"]


def test_a_queued_jobs_workers_are_created_behind_kueues_gate() -> None:
    """Where Kueue does not take them in, they wait instead of running unqueued."""
    assert render.render_worker_pod(JOB, 0)["spec"]["schedulingGates"] == [{"name": queueing.ADMISSION_GATE}]
    assert "schedulingGates" not in render.render_worker_pod(a_cpu_job().as_model(), 0)["spec"]


def test_a_queue_kueue_does_not_honor_is_said_with_a_warning() -> None:
    gated = tuple(replace(p, queued=True) for p in a_gang("Pending", "Pending", "Pending"))
    status = compute_status(JOB, Observed(workers=gated), accepted_status(JOB, "Pending"), NOW)
    ignored = next(c for c in status.conditions if c.type == queueing.NOT_HONORED_CONDITION)
    assert (status.phase, ignored.status, ignored.reason) == ("Queued", "True", queueing.REASON_NOT_MANAGED)
    assert "Kueue did not take its pods in" in ignored.message and "namespace ml" in ignored.message
    warnings = [e for e in status_events(accepted_status(JOB, "Pending"), status) if e.type == "Warning"]
    assert [e.reason for e in warnings] == [queueing.NOT_HONORED_CONDITION]
    taken = tuple(replace(p, kueue_managed=True) for p in gated)
    later = compute_status(JOB, Observed(workers=taken), status, NOW)
    assert next(c for c in later.conditions if c.type == queueing.NOT_HONORED_CONDITION).status == "False"


def test_a_gated_pod_is_queued_and_a_pod_kueue_stopped_is_lost_to_an_eviction() -> None:
    raw = {
        "metadata": {"name": "mnist-0", "uid": "u", "labels": {"dtrain.dev/role": "worker", "dtrain.dev/node-rank": "0"}},
        "spec": {"schedulingGates": [{"name": queueing.ADMISSION_GATE}]},
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]},
    }
    assert observe_pod(raw).queued and not observe_pod(raw).kueue_managed
    raw["metadata"]["labels"][queueing.MANAGED_LABEL] = "true"
    assert observe_pod(raw).kueue_managed
    raw["spec"] = {"nodeName": "node-1"}
    raw["status"] = {
        "phase": "Failed",
        "conditions": [{"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvicted",
                        "message": "Preempted to accommodate a workload (UID: x) due to prioritization in the ClusterQueue"}],
        "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 143}}}],
    }
    stopped = observe_pod(raw)
    assert (stopped.lost, stopped.reason, stopped.exit_code, stopped.queued) == (True, "WorkloadEvicted", None, False)
    assert "Preempted" in stopped.message


def test_a_gang_kueue_holds_is_queued_naming_the_queues_and_kueues_reason() -> None:
    held = tuple(replace(p, queued=True, kueue_managed=True) for p in a_gang("Pending", "Pending", "Pending"))
    queue = QueueObservation("team-a", "cluster-gpus", message="couldn't assign flavors to pod set main: insufficient quota")
    status = compute_status(JOB, Observed(workers=held, queue=queue), accepted_status(JOB, "Pending"), NOW)
    queued = next(c for c in status.conditions if c.type == queueing.CONDITION)
    assert (status.phase, queued.status, queued.reason) == ("Queued", "True", queueing.REASON_WAITING)
    assert queued.message == (
        "waiting for Kueue to admit the gang in LocalQueue team-a (ClusterQueue cluster-gpus): "
        "couldn't assign flavors to pod set main: insufficient quota"
    )
    assert pods_pending_too_long(JOB, dict(enumerate(held)), NOW.replace(year=NOW.year + 1)) == []  # queued, not stuck
    admitted = compute_status(JOB, Observed(workers=a_gang("Pending", "Pending", "Pending"), queue=queue), status, NOW)
    after = next(c for c in admitted.conditions if c.type == queueing.CONDITION)
    assert (admitted.phase, after.status, after.reason) == ("Pending", "False", queueing.REASON_ADMITTED)


def test_an_eviction_restarts_the_gang_as_a_new_generation_without_counting_a_restart() -> None:
    job = QUEUED.with_backoff_limit(0).as_model()  # a counted restart would fail it
    evicted = a_gang("Running", "Running", "Running")
    evicted = tuple(replace(p, phase="Failed", lost=True, reason=queueing.EVICTED_REASON, message="Preempted") for p in evicted)
    status = compute_status(job, Observed(workers=evicted), accepted_status(job), NOW)
    restarting = next(c for c in status.conditions if c.type == "Restarting")
    assert (status.phase, status.restarts, status.evictions, status.gang_generation) == ("Restarting", 0, 1, 1)
    assert restarting.reason == queueing.REASON_EVICTED and "not counted against backoffLimit" in restarting.message
    plan = plan_children(job, status, Observed(workers=evicted), NOW)
    assert {p.name for p in plan.delete_pods} <= {p.name for p in evicted}
    # The new gang is generation 1: its pods are the current ones, the evicted gang's are not.
    new_gang = tuple(replace(a_worker(rank, "Pending", generation=1), queued=True) for rank in range(3))
    queued = compute_status(job, Observed(workers=new_gang), status, NOW)
    assert (queued.phase, queued.restarts, queued.evictions) == ("Queued", 0, 1)


def test_kueues_workload_and_local_queue_are_read_into_an_observation() -> None:
    workload = {"status": {"conditions": [
        {"type": "QuotaReserved", "status": "False", "message": "insufficient unused quota for cpu in flavor default"}]}}
    assert observe_queue("team-a", workload, {"spec": {"clusterQueue": "cq"}}) == QueueObservation(
        "team-a", "cq", message="insufficient unused quota for cpu in flavor default"
    )
    admitted = {"status": {"admission": {"clusterQueue": "cq2"}, "conditions": [
        {"type": "QuotaReserved", "status": "True", "message": "Quota reserved in ClusterQueue cq2"},
        {"type": "Admitted", "status": "True"}]}}
    assert observe_queue("team-a", admitted, {}) == QueueObservation("team-a", "cq2", message="")
    assert observe_queue("team-a", {}, {}) == QueueObservation("team-a")


def test_a_restarted_gang_in_a_queue_has_pods_of_new_names_and_the_same_hostnames() -> None:
    """Kueue lets a pod of its group go only once a pod of another name replaces it."""
    first, restarted = render.render_worker_pod(JOB, 1, gang_generation=0), render.render_worker_pod(JOB, 1, gang_generation=2)
    assert (first["metadata"]["name"], restarted["metadata"]["name"]) == ("mnist-1", "mnist-1-g2")
    assert first["spec"]["hostname"] == restarted["spec"]["hostname"] == "mnist-1"
    assert {"name": "DTRAIN_POD_NAME", "value": "mnist-1-g2"} in restarted["spec"]["containers"][0]["env"]
    unqueued = a_cpu_job().as_model()
    assert render.render_worker_pod(unqueued, 1, gang_generation=2)["metadata"]["name"] == "mnist-1"


def test_the_new_gang_waits_until_kueue_no_longer_counts_the_old_one() -> None:
    """A pod of the evicted gang still running out its grace period is an active member of the group: a new one
    now would be an excess member, which Kueue deletes."""
    status = accepted_status(JOB, "Restarting", evictions=1)
    ending = tuple(replace(p, deleting=True, reason="WorkloadEvictedDueToPreempted") for p in a_gang("Running", "Running"))
    assert plan_children(JOB, status, Observed(workers=ending), NOW).create_ranks == ()
    ended = tuple(replace(p, phase="Failed") for p in ending)
    assert plan_children(JOB, status, Observed(workers=ended), NOW).create_ranks == (0, 1, 2)
    assert queueing.is_queue_stop("WorkloadEvictedDueToPreempted") and not queueing.is_queue_stop("Evicted")


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_queued_job_that_ended_lets_go_of_its_queue(phase: str) -> None:
    """Each worker pod is marked the last of its group, so that Kueue finishes the Workload (the next job is
    admitted) and lifts its finalizers; a pod marked already is left alone, and a job in no queue marks none."""
    ended = accepted_status(JOB, phase)
    pods = a_gang("Failed", "Failed", "Running")
    marked = (replace(pods[0], last_in_group=True), *pods[1:])
    plan = plan_children(JOB, ended, Observed(workers=marked), NOW)
    assert {p.name for p in plan.let_go_pods} == {pods[1].name, pods[2].name}
    assert queueing.last_in_group_patch("uid-1") == {
        "metadata": {"uid": "uid-1", "annotations": {queueing.RETRIABLE_ANNOTATION: "false"}}}
    plain = a_cpu_job().in_namespace("ml").with_nodes(3).with_uid().at_generation(1).as_model()
    assert plan_children(plain, accepted_status(plain, phase), Observed(workers=pods), NOW).let_go_pods == ()
    running = plan_children(JOB, accepted_status(JOB, "Running"), Observed(workers=pods), NOW)
    assert running.let_go_pods == ()
    raw = {"metadata": {"name": "mnist-0", "uid": "u", "labels": {"dtrain.dev/role": "worker"},
                        "annotations": {queueing.RETRIABLE_ANNOTATION: "false"}}, "spec": {}, "status": {}}
    assert observe_pod(raw).last_in_group
