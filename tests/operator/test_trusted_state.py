"""What the operator trusts: its own record of a job (the dtrain.dev/state annotation), never the status.

Every worker pod's token may patch the status of the jobs in its namespace (RBAC cannot say less;
on Kubernetes 1.30+ the chart's admission policy does, as the `tokens` scenario of tests/cluster
checks on a real API server; here none runs, as on an older cluster), so a status patch must not
choose what the operator creates or how many restarts remain, in its own job or another, and a
status the operator cannot read must not wipe the gang.
"""

from __future__ import annotations

import asyncio
import json

from dtrain_operator.api import contract
from tests.builders import a_cpu_job

from .cluster import Cluster

NS = "default"
IMAGE = "registry.example/team/trainer:1.4"


def generations(pods: list[dict]) -> set[str]:
    return {p["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for p in pods}


def uids(pods: list[dict]) -> set[str]:
    return {p["metadata"]["uid"] for p in pods}


async def test_a_status_patch_cannot_choose_the_next_gang_or_reset_the_restarts(operated: Cluster):
    job = a_cpu_job("target").with_nodes(2).with_backoff_limit(5).with_spec(image=IMAGE).as_dict()
    await operated.apply(job)
    await operated.run_all(NS, "target", 2)
    await operated.phase(NS, "target", "Running")
    await operated.exit(NS, "target-1", 1)
    await operated.eventually(
        lambda: len(p := operated.pods(NS, "target")) == 2 and generations(p) == {"1"}, "the gang of generation 1"
    )
    await operated.run_all(NS, "target", 2)
    await operated.phase(NS, "target", "Running")

    # What a worker's token can do where no admission policy runs (before Kubernetes 1.30): patch the whole status.
    accepted = operated.status(NS, "target")["acceptedSpec"]
    evil = {**accepted, "image": "attacker/evil:1", "serviceAccountName": "cluster-admin-sa", "hostNetwork": True,
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}
    await operated.patch_job_status(NS, "target", {"acceptedSpec": evil, "restarts": 0, "startTime": "2100-01-01T00:00:00Z"})
    await operated.exit(NS, "target-0", 1)

    pods = await operated.eventually(
        lambda: len(p := operated.pods(NS, "target")) == 2 and generations(p) == {"2"} and p,
        lambda: f"the gang of generation 2 (pods: {[(p['metadata']['name'], generations([p])) for p in operated.pods(NS, 'target')]})",
    )
    for pod in pods:
        assert {c["image"] for c in pod["spec"]["containers"]} == {IMAGE}
        assert pod["spec"]["serviceAccountName"] == contract.DEFAULT_WORKER_SERVICE_ACCOUNT
        assert not pod["spec"].get("hostNetwork")
        assert not any("hostPath" in v for v in pod["spec"]["volumes"])
    status = await operated.eventually(
        lambda: (s := operated.status(NS, "target")).get("restarts") == 2 and s.get("acceptedSpec") == accepted and s,
        "restarts 2 and the accepted spec written back over the patched one",
    )
    assert status["startTime"] != "2100-01-01T00:00:00Z"
    record = json.loads(operated.job(NS, "target")["metadata"]["annotations"][contract.ANNOTATION_STATE])
    assert (record["restarts"], record["acceptedSpec"]["image"]) == (2, IMAGE)


async def test_a_status_patch_cannot_escape_the_backoff_limit(operated: Cluster):
    await operated.apply(a_cpu_job("bounded").with_nodes(1).with_backoff_limit(1).as_dict())
    await operated.run_all(NS, "bounded", 1)
    await operated.phase(NS, "bounded", "Running")
    await operated.exit(NS, "bounded-0", 1)
    await operated.eventually(lambda: generations(operated.pods(NS, "bounded")) == {"1"}, "the second gang")
    second = await operated.run_all(NS, "bounded", 1)
    await operated.phase(NS, "bounded", "Running")
    await operated.patch_job_status(NS, "bounded", {"restarts": 0, "progress": {"step": 1}})
    await operated.eventually(
        lambda: (s := operated.status(NS, "bounded")).get("restarts") == 1 and s.get("progress"), "restarts written back"
    )
    await asyncio.sleep(0.5)
    assert uids(operated.pods(NS, "bounded")) == uids(second), "the running gang was replaced"
    await operated.exit(NS, "bounded-0", 1)
    await operated.phase(NS, "bounded", "Failed")
    assert operated.condition(NS, "bounded", "Failed")["reason"] == "BackoffLimitExceeded"


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

    # Readable again: the operator goes on from its own record (the failure restarts the gang).
    await operated.patch_job_status(NS, "steady", {"nodes": {"total": 2}})
    await operated.eventually(lambda: operated.status(NS, "steady").get("restarts") == 1, "the restart, once readable")
    assert operated.condition(NS, "steady", "StatusUnreadable")["status"] == "False"
    status = operated.status(NS, "steady")
    assert (status["startTime"], status["acceptedSpec"]) == (before["startTime"], before["acceptedSpec"])
    assert status["acceptedSpec"]["trainer"].get("batchSize") != 999


async def test_a_record_edited_by_hand_is_not_trusted(operated: Cluster):
    await operated.apply(a_cpu_job("recorded").with_nodes(2).as_dict())
    await operated.run_all(NS, "recorded", 2)
    await operated.phase(NS, "recorded", "Running")
    pods = operated.pods(NS, "recorded")
    annotation = operated.job(NS, "recorded")["metadata"]["annotations"][contract.ANNOTATION_STATE]
    record = json.loads(annotation)
    record["acceptedSpec"]["image"] = "attacker/evil:1"
    record["restarts"] = 7
    await operated.patch_job(NS, "recorded", {"metadata": {"annotations": {contract.ANNOTATION_STATE: json.dumps(record)}}})
    condition = await operated.eventually(
        lambda: (c := operated.condition(NS, "recorded", "StatusUnreadable")) and c["status"] == "True" and c,
        "the StatusUnreadable condition",
    )
    assert "signature does not verify" in condition["message"]
    await operated.exit(NS, "recorded-0", 1)
    await operated.patch_job_status(NS, "recorded", {"progress": {"step": 5}})
    await operated.eventually(lambda: operated.status(NS, "recorded").get("progress", {}).get("step") == 5, "progress")
    assert uids(operated.pods(NS, "recorded")) == uids(pods)
    assert operated.status(NS, "recorded")["restarts"] == 0
