"""Worker failures: the whole gang restarts (DDP cannot lose a rank) within runPolicy's limits."""

from __future__ import annotations

import asyncio

import pytest

from dtrain_operator.api import contract
from dtrain_operator.core.progress_deadline import HUNG_GANG_GRACE_SECONDS
from tests.builders import a_cpu_job

from .cluster import Cluster
from .operator_process import OPERATOR_AGENTS

NS = "default"
pytestmark = pytest.mark.real_apiserver


def generations(pods: list[dict]) -> set[str]:
    return {p["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for p in pods}


async def test_a_failed_worker_restarts_the_gang_until_the_backoff_limit(operated: Cluster):
    await operated.apply(a_cpu_job("flaky").with_nodes(3).with_backoff_limit(1).as_dict())
    first = await operated.run_all(NS, "flaky", 3)
    await operated.phase(NS, "flaky", "Running")
    before = operated.audit.requests_of(OPERATOR_AGENTS)

    await operated.exit(NS, "flaky-1", 1, "Traceback ...\nRuntimeError: NCCL error: unhandled system error")
    await operated.eventually(lambda: operated.status(NS, "flaky").get("restarts") == 1, "restarts=1")
    restarting = operated.condition(NS, "flaky", "Restarting")
    assert (restarting["status"], restarting["reason"]) == ("True", "WorkerFailed")
    assert "worker 1 exited with code 1" in restarting["message"]
    assert "NCCL error" in restarting["message"]
    second = await operated.eventually(
        lambda: (p := operated.pods(NS, "flaky")) and len(p) == 3 and generations(p) == {"1"} and p,
        "3 pods of gang generation 1 and none of generation 0",
    )
    assert {p["metadata"]["uid"] for p in second}.isdisjoint(p["metadata"]["uid"] for p in first)
    # The new gang needs no request for its Service (the watch shows it, owned by the job); no ConfigMap is made.
    requests = operated.audit.requests_of(OPERATOR_AGENTS)[len(before):]
    assert [r for r in requests if r.endswith((" services", " configmaps"))] == []
    await operated.run_all(NS, "flaky", 3)
    await operated.phase(NS, "flaky", "Running")
    assert operated.condition(NS, "flaky", "Restarting")["status"] == "False"

    await operated.exit(NS, "flaky-2", 137, reason="OOMKilled")
    await operated.phase(NS, "flaky", "Failed")
    failed = operated.condition(NS, "flaky", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert "worker 2 exited with code 137 (OOMKilled)" in failed["message"]
    status = operated.status(NS, "flaky")
    assert status["restarts"] == 1
    assert status["completionTime"]
    # cleanPodPolicy Running: the running workers go, the failed one stays for its logs.
    await operated.eventually(lambda: [p["metadata"]["name"] for p in operated.pods(NS, "flaky")] == ["flaky-2"],
                              "only the failed pod left")
    events = await operated.event_reasons(NS, "flaky", ["Running", "Restarting", "Running", "Failed"])
    warnings = {e["reason"] for e in events if e["type"] == "Warning"}
    assert warnings == {"Restarting", "Failed"}


async def test_exit_code_policy_fails_a_program_error_at_once(operated: Cluster):
    await operated.apply(a_cpu_job("typo").with_nodes(2).with_restart_policy("ExitCode").as_dict())
    await operated.run_all(NS, "typo", 2)
    await operated.phase(NS, "typo", "Running")
    await operated.exit(NS, "typo-0", 1, "ModuleNotFoundError: No module named 'mymodel'")
    await operated.phase(NS, "typo", "Failed")
    failed = operated.condition(NS, "typo", "Failed")
    assert failed["reason"] == "NonRetryableExitCode"
    assert "No module named 'mymodel'" in failed["message"]
    assert operated.status(NS, "typo")["restarts"] == 0


async def test_exit_code_policy_restarts_signals_and_evictions(operated: Cluster):
    job = a_cpu_job("preempted").with_nodes(2).with_restart_policy("ExitCode").with_backoff_limit(5)
    await operated.apply(job.as_dict())
    await operated.run_all(NS, "preempted", 2)
    await operated.phase(NS, "preempted", "Running")
    await operated.exit(NS, "preempted-1", 143)
    await operated.eventually(lambda: operated.status(NS, "preempted").get("restarts") == 1, "restart after SIGTERM")

    await operated.eventually(lambda: generations(operated.pods(NS, "preempted")) == {"1"}, "gang generation 1")
    await operated.run_all(NS, "preempted", 2)
    await operated.phase(NS, "preempted", "Running")
    await operated.evict(NS, "preempted-0")
    await operated.eventually(lambda: operated.status(NS, "preempted").get("restarts") == 2, "restart after eviction")
    message = operated.condition(NS, "preempted", "Restarting")["message"]
    assert "worker 0 was lost (Evicted)" in message
    assert "low on resource: memory" in message
    assert operated.status(NS, "preempted")["phase"] == "Restarting"


async def test_never_policy_fails_on_the_first_failure(operated: Cluster):
    await operated.apply(a_cpu_job("once").with_nodes(2).with_restart_policy("Never").as_dict())
    await operated.run_all(NS, "once", 2)
    await operated.phase(NS, "once", "Running")
    await operated.exit(NS, "once-1", 137)
    await operated.phase(NS, "once", "Failed")
    assert operated.condition(NS, "once", "Failed")["reason"] == "RestartPolicyNever"
    assert operated.status(NS, "once")["restarts"] == 0


async def test_failure_rules_decide_and_the_status_and_events_name_the_rule(operated: Cluster):
    """ExitCode and a backoffLimit of 0 would fail on exit code 3; the rule restarts without counting it. Then the
    first rule fails the job on an OOM kill, which ExitCode would restart."""
    job = (a_cpu_job("ruled").with_nodes(2).with_restart_policy("ExitCode").with_backoff_limit(0)
           .with_failure_rules({"action": "FailJob", "onReasons": ["OOMKilled"]},
                               {"action": "RestartGangIgnoringBackoff", "onExitCodes": [3],
                                "onTerminationMessage": "CUDA error: an illegal memory access"}))
    await operated.apply(job.as_dict())
    await operated.run_all(NS, "ruled", 2)
    await operated.phase(NS, "ruled", "Running")
    await operated.exit(NS, "ruled-1", 3, "Traceback ...\nRuntimeError: CUDA error: an illegal memory access was encountered")
    await operated.eventually(lambda: operated.status(NS, "ruled").get("restartsIgnoringBackoff") == 1, "an uncounted restart")
    assert operated.status(NS, "ruled")["restarts"] == 0
    restarting = operated.condition(NS, "ruled", "Restarting")
    assert restarting["message"].startswith(
        "failureRules[1] (RestartGangIgnoringBackoff on exit code 3 and termination message "
        "/CUDA error: an illegal memory access/) decided: worker 1 exited with code 3: RuntimeError: CUDA error: an "
        "illegal memory access was encountered"
    )
    await operated.eventually(lambda: generations(operated.pods(NS, "ruled")) == {"1"}
                              and len(operated.pods(NS, "ruled")) == 2, "the new gang, generation 1")
    await operated.run_all(NS, "ruled", 2)
    await operated.phase(NS, "ruled", "Running")
    await operated.exit(NS, "ruled-0", 137, reason="OOMKilled")
    await operated.phase(NS, "ruled", "Failed")
    failed = operated.condition(NS, "ruled", "Failed")
    assert failed["reason"] == "FailedByRule"
    assert failed["message"] == "failureRules[0] (FailJob on reason OOMKilled) decided: worker 0 exited with code 137 (OOMKilled)"
    events = await operated.event_reasons(NS, "ruled", ["Running", "Restarting", "Running", "Failed"])
    assert [e["message"] for e in events if e["reason"] in ("Restarting", "Failed")] == [
        restarting["message"], failed["message"]]


async def test_a_worker_deleted_by_someone_restarts_the_gang(operated: Cluster):
    await operated.apply(a_cpu_job("drained").with_nodes(2).as_dict())
    await operated.run_all(NS, "drained", 2)
    await operated.phase(NS, "drained", "Running")
    await operated.delete("/api/v1/namespaces/default/pods/drained-1")
    await operated.eventually(lambda: operated.status(NS, "drained").get("restarts") == 1, "restart after deletion")
    assert "drained-1" in operated.condition(NS, "drained", "Restarting")["message"]
    await operated.eventually(lambda: generations(operated.pods(NS, "drained")) == {"1"}
                              and len(operated.pods(NS, "drained")) == 2, "the new gang")


async def test_a_new_gang_starts_once_no_pod_of_the_old_one_runs(operated: Cluster):
    """A gang is all or nothing: a new rank beside a terminating old one would find it under its DNS name and
    join the old gang's rendezvous. The failed rank does not hold the new gang back; the terminating one does."""
    await operated.apply(a_cpu_job("slow").with_nodes(2).as_dict())
    await operated.run_all(NS, "slow", 2)
    await operated.phase(NS, "slow", "Running")
    # A finalizer stands for the kubelet's graceful termination: deletion waits until it is removed.
    await operated.patch("/api/v1/namespaces/default/pods/slow-0", {"metadata": {"finalizers": ["test/terminating"]}})
    await operated.exit(NS, "slow-1", 1)
    await operated.eventually(
        lambda: operated.pod(NS, "slow-0")["metadata"].get("deletionTimestamp"), "the old slow-0 terminating"
    )
    await operated.eventually(lambda: [p["metadata"]["name"] for p in operated.pods(NS, "slow")] == ["slow-0"],
                              "the failed slow-1 gone")
    await asyncio.sleep(2)
    assert generations(operated.pods(NS, "slow")) == {"0"}, "no rank of the new gang while slow-0 still runs"
    await operated.patch("/api/v1/namespaces/default/pods/slow-0", {"metadata": {"finalizers": None}})
    await operated.eventually(lambda: generations(operated.pods(NS, "slow")) == {"1"}
                              and len(operated.pods(NS, "slow")) == 2, "both ranks of generation 1")
    # The listing above is the server's; pod_creations counts what the test's watch has seen, which may lag it.
    await operated.eventually(lambda: operated.pod_creations(NS, "slow-0") >= 2, "the new slow-0 in the watch")
    assert operated.pod_creations(NS, "slow-0") == 2
    assert operated.status(NS, "slow")["restarts"] == 1


async def test_the_survivors_of_a_lost_worker_get_the_progress_deadline_as_their_grace(operated: Cluster):
    """A survivor cannot checkpoint on SIGTERM (DDP stops at a step boundary with every rank), so it is not given
    terminationGracePeriodSeconds (600 s by default): the progress deadline, while its lost peer's pod is on its
    way out; the hung gang's grace once that pod has vanished (a lost node's, force-deleted: its processes closed
    no connection, the survivor waits in a collective that never returns)."""
    await operated.apply(a_cpu_job("lost").with_nodes(2).with_progress_deadline(45).as_dict())
    await operated.run_all(NS, "lost", 2)
    await operated.phase(NS, "lost", "Running")
    await operated.hold_termination(NS, "lost-1")  # its processes still ending: the kubelet has not confirmed
    await operated.delete("/api/v1/namespaces/default/pods/lost-1")
    await operated.eventually(lambda: operated.deletion_grace(NS, "lost-0") is not None, "the survivor deleted")
    assert operated.deletion_grace(NS, "lost-0") == 45

    await operated.apply(a_cpu_job("gone").with_nodes(2).with_progress_deadline(45).as_dict())
    await operated.run_all(NS, "gone", 2)
    await operated.phase(NS, "gone", "Running")
    await operated.delete("/api/v1/namespaces/default/pods/gone-1", force=True)
    await operated.eventually(lambda: operated.deletion_grace(NS, "gone-0") is not None, "the survivor deleted")
    assert operated.deletion_grace(NS, "gone-0") == HUNG_GANG_GRACE_SECONDS

    # Without a progress deadline, the pod's own grace period, as before.
    await operated.apply(a_cpu_job("patient").with_nodes(2).with_progress_deadline(0).as_dict())
    own_grace = (await operated.run_all(NS, "patient", 2))[0]["spec"].get("terminationGracePeriodSeconds")
    await operated.phase(NS, "patient", "Running")
    await operated.exit(NS, "patient-1", 137)
    await operated.eventually(lambda: operated.status(NS, "patient").get("restarts") == 1, "restarts=1")

    def survivor_deleted() -> bool:
        """Gang generation 0's rank 0 is being deleted, or already gone (the kubelet confirmed it at once)."""
        old = [p for p in operated.pods(NS, "patient") if p["metadata"]["name"] == "patient-0"
               and p["metadata"]["labels"][contract.LABEL_GANG_GENERATION] == "0"]
        return not old or bool(old[0]["metadata"].get("deletionTimestamp"))

    await operated.eventually(survivor_deleted, "the survivor deleted")
    # The emulator records no grace where the request named none; a real server, the pod's own.
    assert operated.deletion_grace(NS, "patient-0") in (None, own_grace)
