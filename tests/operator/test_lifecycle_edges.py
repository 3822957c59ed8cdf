"""The lifecycle's edges: pods that take their time to terminate, pods that finished and went,
gangs that cannot start, stale progress. Pods are held by a finalizer the way a kubelet's
graceful termination holds them (kubelet.py)."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from dtrain_operator.api import contract
from tests.builders import a_cpu_job

from . import kubelet
from .apiserver import now_rfc3339
from .cluster import Cluster

NS = "default"
pytestmark = pytest.mark.real_apiserver


def generations(pods: list[dict]) -> set[str]:
    return {p["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for p in pods}


def condition_history(cluster: Cluster, namespace: str, name: str, type_: str, status: str) -> list[dict]:
    """Every version of the job's `type_` condition with `status` that was ever stored, oldest first."""
    found = []
    for version in cluster.job_versions(namespace, name):
        for condition in (version.get("status") or {}).get("conditions") or []:
            if condition["type"] == type_ and condition["status"] == status and condition not in found:
                found.append(condition)
    return found


async def test_resume_before_the_suspended_pods_are_gone_counts_no_failure(operated: Cluster):
    await operated.apply(a_cpu_job("preempted").with_nodes(2).with_restart_policy("Never").as_dict())
    pods = await operated.run_all(NS, "preempted", 2)
    await operated.phase(NS, "preempted", "Running")
    await kubelet.hold_all(operated, NS, pods)

    # Kueue-style preempt and readmit: suspended, and resumed while the pods still terminate.
    await operated.patch_job(NS, "preempted", {"spec": {"runPolicy": {"suspend": True}}})
    await operated.phase(NS, "preempted", "Suspended")
    await operated.eventually(lambda: len(kubelet.terminating(operated, NS, "preempted")) == 2, "2 pods terminating")
    await operated.patch_job(NS, "preempted", {"spec": {"runPolicy": {"suspend": False}}})
    await operated.phase(NS, "preempted", "Pending")
    await asyncio.sleep(0.5)
    status = operated.status(NS, "preempted")
    assert (status["phase"], status["restarts"]) == ("Pending", 0)

    # The old containers exit (SIGTERM) and the pods go: the same gang starts again.
    for name in ("preempted-0", "preempted-1"):
        await kubelet.finish_termination(operated, NS, name)
    new = await operated.eventually(
        lambda: len(p := operated.pods(NS, "preempted")) == 2 and not kubelet.terminating(operated, NS, "preempted") and p,
        "the new pods, once the old ones are gone",
    )
    assert generations(new) == {"0"}
    await operated.run_all(NS, "preempted", 2)
    status = await operated.phase(NS, "preempted", "Running")
    assert status["restarts"] == 0
    await operated.event_reasons(NS, "preempted", ["Running", "Suspended", "Running"])


async def test_a_finished_worker_whose_pod_goes_stays_finished(operated: Cluster):
    await operated.apply(a_cpu_job("exported").with_nodes(2).as_dict())
    await operated.run_all(NS, "exported", 2)
    await operated.phase(NS, "exported", "Running")
    rank0 = operated.pod(NS, "exported-0")["metadata"]["uid"]
    await operated.exit(NS, "exported-1", 0)
    await asyncio.sleep(1.1)
    progress = {"stage": contract.PROGRESS_STAGE_EXPORTING, "updatedAt": now_rfc3339()}
    await operated.patch_job_status(NS, "exported", {"progress": progress})
    await operated.phase(NS, "exported", "Exporting")
    await operated.eventually(lambda: operated.status(NS, "exported")["nodes"]["succeeded"] == 1, "rank 1 counted")

    # The node is drained and the finished pod garbage-collected.
    await operated.delete("/api/v1/namespaces/default/pods/exported-1")
    await asyncio.sleep(0.5)
    status = operated.status(NS, "exported")
    assert (status["phase"], status["restarts"], status["nodes"]["succeeded"]) == ("Exporting", 0, 1)
    assert operated.pod(NS, "exported-0")["metadata"]["uid"] == rank0
    assert not operated.pod(NS, "exported-0")["metadata"].get("deletionTimestamp")
    assert [p["metadata"]["name"] for p in operated.pods(NS, "exported")] == ["exported-0"]

    await operated.exit(NS, "exported-0", 0)
    status = await operated.phase(NS, "exported", "Succeeded")
    assert (status["restarts"], status["nodes"]["succeeded"]) == (0, 2)


async def test_exit_code_policy_restarts_when_a_node_is_lost_whatever_the_timing(cluster: Cluster):
    operator = await cluster.start_operator()
    await cluster.apply(a_cpu_job("faraway").with_nodes(3).with_restart_policy("ExitCode").as_dict())
    await cluster.run_all(NS, "faraway", 3)
    await cluster.phase(NS, "faraway", "Running")
    # The operator sees everything at once (as after a slow watch or its own restart): rank 0's
    # node is gone; ranks 1 and 2 exit 1 on the broken connection at once, while rank 0's pod is
    # marked lost by the node controller only later.
    operator.kill()
    await cluster.exit(NS, "faraway-1", 1, "RuntimeError: Connection reset by peer")
    await cluster.exit(NS, "faraway-2", 1, "RuntimeError: Connection reset by peer")
    await asyncio.sleep(2.1)
    await cluster.evict(NS, "faraway-0")
    await cluster.start_operator()
    status = await cluster.eventually(
        lambda: (s := cluster.status(NS, "faraway")).get("phase") in ("Restarting", "Failed") and s, "a decision"
    )
    assert (status["phase"], status["restarts"]) == ("Restarting", 1), cluster.condition(NS, "faraway", "Failed")
    assert "worker 0 was lost (Evicted)" in cluster.condition(NS, "faraway", "Restarting")["message"]


async def test_a_stale_exporting_stage_from_the_previous_gang_is_not_the_new_gangs(operated: Cluster):
    await operated.apply(a_cpu_job("twice").with_nodes(2).as_dict())
    await operated.run_all(NS, "twice", 2)
    await operated.phase(NS, "twice", "Running")
    await asyncio.sleep(1.1)
    await operated.patch_job_status(NS, "twice", {"progress": {"stage": "exporting", "updatedAt": now_rfc3339()}})
    await operated.phase(NS, "twice", "Exporting")
    # Rank 1 fails while rank 0 exports: the new gang trains again, from the checkpoint.
    await operated.exit(NS, "twice-1", 1)
    await operated.eventually(
        lambda: len(p := operated.pods(NS, "twice")) == 2 and generations(p) == {"1"}, "the gang of generation 1"
    )
    await operated.run_all(NS, "twice", 2)
    status = await operated.phase(NS, "twice", "Running")
    assert status["progress"]["stage"] == "exporting"  # the trainer's report, shown as it is
    await asyncio.sleep(1.1)
    await operated.patch_job_status(NS, "twice", {"progress": {"stage": "exporting", "updatedAt": now_rfc3339()}})
    await operated.phase(NS, "twice", "Exporting")


def seconds_between(earlier: str, later: str) -> float:
    """Between two RFC 3339 times of the API server."""
    return (datetime.fromisoformat(later.replace("Z", "+00:00")) - datetime.fromisoformat(earlier.replace("Z", "+00:00"))).total_seconds()


async def test_a_restart_blocked_by_a_pod_stuck_terminating_says_so_and_goes_on(cluster: Cluster):
    await cluster.start_operator("--stuck-terminating-timeout=2")
    # The timeout counts from the end of the grace period (the pod's deletionTimestamp), never within it.
    await cluster.apply(a_cpu_job("stranded").with_nodes(2).with_spec(terminationGracePeriodSeconds=15).as_dict())
    pods = await cluster.run_all(NS, "stranded", 2)
    await cluster.phase(NS, "stranded", "Running")
    await kubelet.hold_all(cluster, NS, pods)
    # Rank 0's node is gone for good: its pod will never finish terminating.
    await kubelet.node_lost(cluster, NS, "stranded-0")
    await cluster.exit(NS, "stranded-1", 1, "RuntimeError: Connection reset by peer")
    await cluster.phase(NS, "stranded", "Restarting")
    deleted = await cluster.eventually(
        lambda: cluster.pod(NS, "stranded-0")["metadata"].get("deletionTimestamp") and cluster.pod(NS, "stranded-0"),
        "stranded-0 deleted",
    )
    grace_ends = deleted["metadata"]["deletionTimestamp"]
    assert deleted["metadata"]["deletionGracePeriodSeconds"] == 15
    await kubelet.finish_termination(cluster, NS, "stranded-1", exit_code=1)

    # The stuck pod is named (the condition is short-lived here: the pod is force-deleted at once).
    condition = await cluster.eventually(
        lambda: next(iter(condition_history(cluster, NS, "stranded", "PodsStuckTerminating", "True")), None),
        "the PodsStuckTerminating condition", timeout=30,
    )
    assert condition["message"].startswith("stranded-0: still terminating 2 s after the end of the grace period")
    assert seconds_between(grace_ends, condition["lastTransitionTime"]) >= 2
    events = await cluster.eventually(
        lambda: [e for e in cluster.events(NS, "stranded") if e["reason"] == "PodsStuckTerminating"], "its Event"
    )
    assert "stranded-0" in events[0]["message"] and events[0]["type"] == "Warning"
    # The pod whose node stopped reporting is force-deleted; the new gang starts.
    new = await cluster.eventually(
        lambda: len(p := cluster.pods(NS, "stranded")) == 2 and generations(p) == {"1"} and p, "the gang of generation 1"
    )
    await cluster.run_all(NS, "stranded", 2)
    status = await cluster.phase(NS, "stranded", "Running")
    assert status["restarts"] == 1
    assert cluster.condition(NS, "stranded", "PodsStuckTerminating")["status"] == "False"
    assert {p["metadata"]["name"] for p in new} == {"stranded-0", "stranded-1"}


async def test_an_image_that_cannot_be_pulled_is_said_at_once_once_and_fails_the_job(cluster: Cluster):
    await cluster.start_operator("--image-pull-timeout=4")
    await cluster.apply(a_cpu_job("unpulled").with_nodes(2).with_spec(image="registry.example/missing:1").as_dict())
    await cluster.eventually(lambda: len(cluster.pods(NS, "unpulled")) == 2, "2 pods")
    async with kubelet.pull_flipping(cluster, NS, ["unpulled-0", "unpulled-1"]) as flips:
        condition = await cluster.eventually(
            lambda: (c := cluster.condition(NS, "unpulled", "ImagePullFailing")) and c["status"] == "True" and c,
            "the ImagePullFailing condition", timeout=3,
        )
        assert condition["message"].startswith("ImagePullBackOff: unpulled-0: ")
        assert "ImagePullFailed" in condition["message"]
        await cluster.eventually(lambda: flips[0] >= 6, "6 flips of the pull reason")
        status = await cluster.phase(NS, "unpulled", "Failed", timeout=15)
    failed = cluster.condition(NS, "unpulled", "Failed")
    assert failed["reason"] == "ImagePullFailed"
    assert "unpulled-0" in failed["message"] and "unpulled-1" in failed["message"]
    assert status["restarts"] == 0
    pulls = [e for e in cluster.events(NS, "unpulled") if e["reason"] == "ImagePullFailing"]
    assert len(pulls) == 1, [e["message"] for e in pulls]
    assert pulls[0]["count"] >= 2 and pulls[0]["lastTimestamp"] >= pulls[0]["firstTimestamp"]
