"""The status is the operator's record of a job: it alone writes it, decides from it at every reconcile,
and leaves the gang alone while it cannot read it.
"""

from __future__ import annotations

import asyncio

import pytest

from dtrain_operator.api import contract
from tests.builders import a_cpu_job

from .cluster import Cluster

NS = "default"
pytestmark = pytest.mark.real_apiserver
IMAGE = "registry.example/team/trainer:1.4"


def generations(pods: list[dict]) -> set[str]:
    return {p["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for p in pods}


def uids(pods: list[dict]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


async def test_a_new_operator_goes_on_from_the_status(cluster: Cluster):
    """The status alone carries what was decided: an operator started afresh keeps the restarts, the gang and a
    rank that finished while its pod is gone since (status.succeededRanks)."""
    operator = await cluster.start_operator()
    await cluster.apply(a_cpu_job("carried").with_nodes(2).with_backoff_limit(3).as_dict())
    await cluster.run_all(NS, "carried", 2)
    await cluster.phase(NS, "carried", "Running")
    await cluster.exit(NS, "carried-1", 1)
    await cluster.eventually(lambda: generations(cluster.pods(NS, "carried")) == {"1"}, "the second gang")
    pods = await cluster.run_all(NS, "carried", 2)
    await cluster.phase(NS, "carried", "Running")
    await cluster.exit(NS, "carried-1", 0)
    await cluster.eventually(lambda: cluster.status(NS, "carried").get("succeededRanks") == [1], "rank 1 finished")
    operator.kill()
    await cluster.delete(f"/api/v1/namespaces/{NS}/pods/carried-1")

    await cluster.start_operator()
    await cluster.exit(NS, "carried-0", 0)
    status = await cluster.phase(NS, "carried", "Succeeded")
    assert (status["restarts"], status["nodes"]["succeeded"]) == (1, 2)
    assert uids(cluster.pods(NS, "carried")) == {p["metadata"]["uid"] for p in pods if p["metadata"]["name"] == "carried-0"}


@pytest.mark.emulator("an edit and a status the CRD refuses (stored under an older CRD)")
async def test_an_unreadable_status_leaves_the_gang_alone(operated: Cluster):
    await operated.apply(a_cpu_job("steady").with_nodes(2).as_dict())
    await operated.run_all(NS, "steady", 2)
    before = await operated.phase(NS, "steady", "Running")
    # An immutable field changed earlier: reported, not applied (a CRD from before its CEL rules
    # lets the edit through; a current API server refuses it).
    await operated.patch_job(NS, "steady", {"spec": {"trainer": {"batchSize": 999}}})
    await operated.eventually(lambda: (operated.condition(NS, "steady", "SpecImmutable") or {}).get("status") == "True",
                              "SpecImmutable")
    pods = operated.pods(NS, "steady")

    # What the trainer reports is read as absent when it cannot be read: it never stops the operator deciding.
    await operated.patch_job_status(NS, "steady", {"progress": {"epoch": "three", "step": 12}})
    # A field of the operator's own that it cannot read (a newer operator's, a tool's edit) does.
    await operated.patch_job_status(NS, "steady", {"nodes": {"total": "three"}})
    condition = await operated.eventually(
        lambda: (c := operated.condition(NS, "steady", "StatusUnreadable")) and c["status"] == "True" and c,
        "the StatusUnreadable condition",
    )
    assert "status.nodes.total" in condition["message"] and '"three"' in condition["message"]
    assert "status.progress" not in condition["message"]
    assert condition["reason"] == "UnreadableStatus"
    await operated.eventually(lambda: "StatusUnreadable" in [e["reason"] for e in operated.events(NS, "steady")],
                              "a StatusUnreadable event")
    # A worker failing now changes nothing either: the operator decides nothing from this status.
    await operated.exit(NS, "steady-1", 1)
    await asyncio.sleep(0.5)
    await operated.patch_job_status(NS, "steady", {"nodes": {"total": "four"}})
    await operated.eventually(
        lambda: '"four"' in (operated.condition(NS, "steady", "StatusUnreadable") or {}).get("message", ""),
        "the condition naming the newer unreadable value",
    )
    assert uids(operated.pods(NS, "steady")) == uids(pods)
    assert all(not p["metadata"].get("deletionTimestamp") for p in operated.pods(NS, "steady"))
    status = operated.status(NS, "steady")
    assert (status["startTime"], status["restarts"], status["acceptedSpec"]) == (
        before["startTime"], 0, before["acceptedSpec"]
    )

    # Readable again: the operator goes on from the status (the failure restarts the gang).
    await operated.patch_job_status(NS, "steady", {"nodes": {"total": 2}})
    await operated.eventually(lambda: operated.status(NS, "steady").get("restarts") == 1, "the restart, once readable")
    assert operated.condition(NS, "steady", "StatusUnreadable")["status"] == "False"
    status = operated.status(NS, "steady")
    assert (status["startTime"], status["acceptedSpec"]) == (before["startTime"], before["acceptedSpec"])
    assert status["acceptedSpec"]["trainer"].get("batchSize") != 999
