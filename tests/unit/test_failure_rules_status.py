"""runPolicy.failureRules in the operator: the decision a rule makes, in the status it computes (its
conditions and counts), in the Events and status patch that follow, and in the record the next reconcile
reads back (the rules themselves: test_failure_rules.py)."""

from __future__ import annotations

from dtrain_operator.api import contract
from dtrain_operator.core.child_plan import plan_children
from dtrain_operator.core.gang_state import worker_failures
from dtrain_operator.core.observation import Observed
from dtrain_operator.core.policy import decide_on_failure
from dtrain_operator.core.status.compute import compute_status
from dtrain_operator.core.status.events import status_events, status_patch
from dtrain_operator.core.status.observe import observe_pod
from tests.builders import NOW, a_cpu_job, a_gang, a_worker, accepted_status, read_back

MNIST = a_cpu_job().in_namespace("ml").with_nodes(3).with_uid().at_generation(1)


def test_the_operator_restarts_by_the_rule_and_names_it_in_the_condition_and_the_event():
    job = (MNIST.with_restart_policy("ExitCode").with_backoff_limit(0)
           .with_failure_rules({"action": "RestartGangIgnoringBackoff", "onExitCodes": [143]}).as_model())
    failed = a_worker(1, "Failed", exit_code=143, reason="Error", message="SIGTERM from the node's shutdown")
    previous = accepted_status(job)
    status = compute_status(job, Observed(workers=(a_worker(0), failed, a_worker(2))), previous, NOW)
    counts = (status.phase, status.restarts, status.restarts_ignoring_backoff, status.gang_generation)
    assert counts == ("Restarting", 0, 1, 1)
    restarting = next(c for c in status.conditions if c.type == "Restarting")
    assert restarting.reason == "WorkerFailed"
    assert restarting.message.startswith(
        "failureRules[0] (RestartGangIgnoringBackoff on exit code 143) decided: worker 1 exited with code 143: "
        "SIGTERM from the node's shutdown; restarting the gang from the last checkpoint (not counted against backoffLimit)"
    )
    [event] = [e for e in status_events(previous, status) if e.reason == "Restarting"]
    assert (event.type, event.message) == ("Warning", restarting.message)
    assert "restartsIgnoringBackoff" in (status_patch(previous, status) or {})
    # The new gang is generation 1, and the status the next reconcile reads carries the count that makes it so.
    plan = plan_children(job, status, Observed(workers=(a_worker(0), failed, a_worker(2))), NOW)
    assert {p.name for p in plan.delete_pods} <= {"mnist-0", "mnist-1", "mnist-2"}
    recorded = read_back(status)
    assert (recorded.restarts_ignoring_backoff, recorded.gang_generation) == (1, 1)
    running = compute_status(job, Observed(workers=a_gang("Running", "Running", "Running", generation=1)), status, NOW)
    assert (running.phase, running.restarts_ignoring_backoff) == ("Running", 1)


def test_the_operator_fails_the_job_by_a_fail_job_rule():
    job = MNIST.with_failure_rules({"action": "FailJob", "onReasons": ["OOMKilled"]}).as_model()
    oom = a_worker(2, "Failed", exit_code=137, reason="OOMKilled")
    previous = accepted_status(job)
    status = compute_status(job, Observed(workers=(a_worker(0), a_worker(1), oom)), previous, NOW)
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert (status.phase, failed.reason) == ("Failed", "FailedByRule")
    assert failed.message == "failureRules[0] (FailJob on reason OOMKilled) decided: worker 2 exited with code 137 (OOMKilled)"
    [event] = [e for e in status_events(previous, status) if e.reason == "Failed"]
    assert event.message == failed.message


def test_a_pod_the_scheduler_preempts_is_preempted_while_it_terminates():
    """The scheduler marks its victim (DisruptionTarget, PreemptionByScheduler) and deletes it: the pod runs out
    its grace period as Running, and the rule on Preempted decides then, not only once the pod has Failed."""
    raw = {
        "metadata": {"name": "mnist-1", "uid": "u1", "deletionTimestamp": "2026-05-01T12:00:30Z",
                     "labels": {contract.LABEL_ROLE: "worker", contract.LABEL_NODE_RANK: "1",
                                contract.LABEL_GANG_GENERATION: "0"}},
        "status": {"phase": "Running", "conditions": [
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
             "message": "Kubernetes Scheduler: preempting to accommodate a higher priority pod"}]},
    }
    pod = observe_pod(raw)
    assert (pod.deleting, pod.lost, pod.reason) == (True, False, "PreemptionByScheduler")
    job = MNIST.with_failure_rules({"action": "RestartGangIgnoringBackoff", "onReasons": ["Preempted"]}).as_model()
    failures = worker_failures(job, {0: a_worker(0), 1: pod, 2: a_worker(2)}, gang_started=True)
    assert [(f.rank, f.exit_code, f.reason) for f in failures] == [(1, None, "PreemptionByScheduler")]
    decision = decide_on_failure(job.spec.run_policy, failures, restarts=0)
    assert decision.count == "restartsIgnoringBackoff"
    assert decision.message.startswith("failureRules[0] (RestartGangIgnoringBackoff on reason Preempted) decided: "
                                       "worker 1 was lost (PreemptionByScheduler): Kubernetes Scheduler: preempting")
    # Deleted by anyone else, it is Deleted, as before.
    other = observe_pod({**raw, "status": {"phase": "Running"}})
    [deleted] = worker_failures(job, {0: a_worker(0), 1: other, 2: a_worker(2)}, gang_started=True)
    assert deleted.reason == "Deleted"


def test_the_status_keeps_the_restarts_no_backoff_limit_counts():
    status = accepted_status(MNIST.as_model(), "Running", restarts=1, evictions=1, restartsIgnoringBackoff=2)
    previous = read_back(status)
    assert (previous.restarts, previous.evictions, previous.restarts_ignoring_backoff) == (1, 1, 2)
    assert previous.gang_generation == 4
