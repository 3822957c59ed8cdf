"""The operator killed at bad moments, an API server that errs and watches that die, many jobs at once,
children that already exist."""

from __future__ import annotations

import asyncio
import time

import kmock
import pytest

from dtrain_operator.api import contract
from tests.builders import a_cpu_job

from .cluster import Cluster
from .kmock_adapter import is_dry_run
from .operator_process import OPERATOR_AGENTS

NS = "default"


def from_operator(request) -> bool:
    return request.headers.get("User-Agent", "").startswith(OPERATOR_AGENTS)


def pod_creates(request) -> bool:
    return (request.action == kmock.action.CREATE and not is_dry_run(request) and request.resource.plural == "pods"
            and from_operator(request))


def pod_deletes(request) -> bool:
    return request.action == kmock.action.DELETE and request.resource.plural == "pods" and from_operator(request)


def generation_of(pods: list[dict]) -> set[str]:
    return {p["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for p in pods}


@pytest.mark.parametrize("held_requests", ["lost-responses", "never-processed"])
async def test_killed_while_creating_pods(cluster: Cluster, held_requests: str):
    operator = await cluster.start_operator()
    gate = cluster.api.faults.gate(pod_creates, after=2)
    await cluster.apply(a_cpu_job("big").with_nodes(5).as_dict())
    await cluster.eventually(lambda: gate.held == 3 and len(cluster.pods(NS, "big")) == 2, "2 pods created, 3 held")
    status = cluster.status(NS, "big")
    operator.kill()
    gate.release(fail=held_requests == "never-processed")

    await cluster.start_operator()
    pods = await cluster.run_all(NS, "big", 5)
    await cluster.phase(NS, "big", "Running")
    assert [p["metadata"]["name"] for p in pods] == [f"big-{rank}" for rank in range(5)]
    assert all(cluster.pod_creations(NS, f"big-{rank}") == 1 for rank in range(5))
    after = cluster.status(NS, "big")
    assert (after["startTime"], after["restarts"], after["acceptedSpec"]) == (
        status["startTime"], 0, status["acceptedSpec"]
    )


async def test_killed_in_the_middle_of_a_gang_restart(cluster: Cluster):
    operator = await cluster.start_operator()
    await cluster.apply(a_cpu_job("resilient").with_nodes(3).as_dict())
    await cluster.run_all(NS, "resilient", 3)
    await cluster.phase(NS, "resilient", "Running")

    gate = cluster.api.faults.gate(pod_deletes)
    await cluster.exit(NS, "resilient-1", 1)
    # The restart is decided and written before any pod is deleted.
    await cluster.eventually(lambda: gate.held == 3 and cluster.status(NS, "resilient")["restarts"] == 1,
                             "restarts=1 written, the old gang's deletions in flight")
    operator.kill()
    gate.release(fail=True)
    assert generation_of(cluster.pods(NS, "resilient")) == {"0"}

    await cluster.start_operator()
    pods = await cluster.eventually(
        lambda: len(p := cluster.pods(NS, "resilient")) == 3 and generation_of(p) == {"1"} and p,
        "the old gang deleted and the new one created by the next operator",
    )
    assert all(cluster.pod_creations(NS, p["metadata"]["name"]) == 2 for p in pods)
    await cluster.run_all(NS, "resilient", 3)
    status = await cluster.phase(NS, "resilient", "Running")
    assert status["restarts"] == 1


async def test_killed_between_deleting_the_old_gang_and_creating_the_new(cluster: Cluster):
    operator = await cluster.start_operator()
    await cluster.apply(a_cpu_job("halfway").with_nodes(2).as_dict())
    await cluster.run_all(NS, "halfway", 2)
    await cluster.phase(NS, "halfway", "Running")
    gate = cluster.api.faults.gate(pod_creates)
    await cluster.exit(NS, "halfway-0", 137)
    await cluster.eventually(lambda: gate.held >= 1 and cluster.pods(NS, "halfway") == [], "old gang gone, creates held")
    operator.kill()
    gate.release(fail=True)

    await cluster.start_operator()
    pods = await cluster.run_all(NS, "halfway", 2)
    assert generation_of(pods) == {"1"}
    status = await cluster.phase(NS, "halfway", "Running")
    assert status["restarts"] == 1


async def test_recovers_from_server_errors_and_conflicts(operated: Cluster):
    faults = operated.api.faults
    await operated.apply(a_cpu_job("steady").with_nodes(2).as_dict())
    await operated.run_all(NS, "steady", 2)
    await operated.phase(NS, "steady", "Running")

    # Every request of the operator fails for 3 s, its watches included (they are dropped to reconnect).
    faults.fail(from_operator, status=500, seconds=3)
    faults.drop_watches()
    await operated.apply(a_cpu_job("during").with_nodes(2).as_dict())
    await operated.exit(NS, "steady-1", 1)
    await asyncio.sleep(0.5)
    assert faults.failed > 0
    # Then pod creations meet 409s for pods that do not exist (a create that raced a delete).
    faults.fail(pod_creates, status=409, reason="AlreadyExists", times=3)

    pods = await operated.run_all(NS, "during", 2)
    assert [p["metadata"]["name"] for p in pods] == ["during-0", "during-1"]
    await operated.phase(NS, "during", "Running")
    await operated.eventually(
        lambda: len(p := operated.pods(NS, "steady")) == 2 and generation_of(p) == {"1"}, "steady's new gang"
    )
    await operated.run_all(NS, "steady", 2)
    status = await operated.phase(NS, "steady", "Running")
    assert status["restarts"] == 1


async def test_a_silently_dead_watch_is_reopened_and_nothing_is_missed(cluster: Cluster):
    await cluster.start_operator("--watch-timeout=2")
    await cluster.apply(a_cpu_job("watched").with_nodes(2).as_dict())
    await cluster.run_all(NS, "watched", 2)
    await cluster.phase(NS, "watched", "Running")

    cluster.api.faults.stall_watches(3)
    await cluster.exit(NS, "watched-0", 1)
    await cluster.apply(a_cpu_job("unseen").with_nodes(1).as_dict())
    await asyncio.sleep(1)
    assert cluster.status(NS, "watched")["restarts"] == 0, "the stalled watch should not have delivered the failure"
    assert cluster.pods(NS, "unseen") == []

    await cluster.eventually(lambda: cluster.status(NS, "watched").get("restarts") == 1, "the failure seen", timeout=20)
    await cluster.eventually(lambda: len(cluster.pods(NS, "unseen")) == 1, "the new job's pod", timeout=20)

    cluster.api.faults.drop_watches()
    await cluster.exit(NS, "unseen-0", 0)
    await cluster.phase(NS, "unseen", "Succeeded")


async def test_twenty_jobs_in_two_namespaces_do_not_interfere(operated: Cluster):
    nodes = {(ns, f"job-{i}"): 1 + (i + offset) % 3 for offset, ns in ((0, "team-a"), (1, "team-b")) for i in range(10)}
    await asyncio.gather(
        *(operated.apply(a_cpu_job(name).in_namespace(ns).with_nodes(n).as_dict()) for (ns, name), n in nodes.items())
    )
    for (ns, name), n in nodes.items():
        await operated.run_all(ns, name, n)
    for ns, name in nodes:
        await operated.phase(ns, name, "Running")
    uids = {key: {p["metadata"]["uid"] for p in operated.pods(*key)} for key in nodes}

    await operated.exit("team-a", "job-3-0", 1)
    await operated.patch_job("team-b", "job-5", {"spec": {"runPolicy": {"suspend": True}}})
    await operated.exit("team-a", "job-7-0", 0)
    await operated.eventually(lambda: operated.status("team-a", "job-3").get("restarts") == 1, "team-a/job-3 restarted")
    await operated.phase("team-b", "job-5", "Suspended")
    await operated.phase("team-a", "job-7", "Succeeded")
    await operated.eventually(lambda: operated.pods("team-b", "job-5") == [], "team-b/job-5 pods deleted")

    for key in nodes:
        if key in {("team-a", "job-3"), ("team-b", "job-5"), ("team-a", "job-7")}:
            continue
        status = operated.status(*key)
        assert (status["phase"], status["restarts"]) == ("Running", 0), key
        assert {p["metadata"]["uid"] for p in operated.pods(*key)} == uids[key], key
    # Same names in the other namespace were left alone.
    assert operated.status("team-b", "job-3")["restarts"] == 0
    assert operated.status("team-a", "job-5")["phase"] == "Running"


async def test_children_that_exist_already_are_adopted_not_duplicated(cluster: Cluster):
    """As after an operator that died before it saw its own creations: the children carry its owner reference."""
    job = await cluster.apply(a_cpu_job("inherited").with_nodes(2).as_dict())
    owner = [{"apiVersion": contract.API_VERSION, "kind": contract.KIND, "name": "inherited",
              "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
    service = await cluster.create({"apiVersion": "v1", "kind": "Service",
                                    "metadata": {"name": "inherited", "namespace": NS, "ownerReferences": owner},
                                    "spec": {"clusterIP": "None"}})
    await cluster.start_operator()
    await cluster.eventually(lambda: len(cluster.pods(NS, "inherited")) == 2, "the pods")
    (kept,) = cluster.objects("v1/services", NS, None)
    assert kept["metadata"]["uid"] == service["metadata"]["uid"]
    assert cluster.api.count_calls(OPERATOR_AGENTS, verb="get", resource="services") == 1


async def test_a_child_name_taken_by_a_stranger_blocks_the_job_until_it_is_gone(operated: Cluster):
    await operated.create({"apiVersion": "v1", "kind": "Service",
                           "metadata": {"name": "squatted", "namespace": NS}, "spec": {"clusterIP": "None"}})
    await operated.apply(a_cpu_job("squatted").with_nodes(1).as_dict())
    events = await operated.eventually(
        lambda: [e for e in operated.events(NS, "squatted") if e["reason"] == "ChildConflict"], "a ChildConflict event"
    )
    assert "Service default/squatted exists and is not owned by this job" in events[0]["message"]
    assert operated.pods(NS, "squatted") == []
    await operated.delete("/api/v1/namespaces/default/services/squatted")
    await operated.eventually(lambda: len(operated.pods(NS, "squatted")) == 1, "the pod once the name is free")


async def test_a_storm_of_429s_is_waited_out_as_the_server_asks(operated: Cluster):
    # Priority and fairness sheds load: 20 pod creations in a row answered 429, Retry-After: 1.
    operated.api.faults.fail(pod_creates, status=429, reason="TooManyRequests", times=20, retry_after=1)
    started = time.monotonic()
    await operated.apply(a_cpu_job("throttled").with_nodes(2).as_dict())
    await operated.eventually(lambda: len(operated.pods(NS, "throttled")) == 2, "2 pods despite the 429s", timeout=40)
    took = time.monotonic() - started
    print(f"20 x 429 (Retry-After: 1 s) delayed the pods by {took:.1f} s")
    assert operated.api.faults.failed == 20
    # Two creations at a time, each retried after the 1 s asked for: about 10 s, not minutes.
    assert took < 20, took
    await operated.run_all(NS, "throttled", 2)
    await operated.phase(NS, "throttled", "Running")
    assert all(operated.pod_creations(NS, f"throttled-{rank}") == 1 for rank in range(2))
