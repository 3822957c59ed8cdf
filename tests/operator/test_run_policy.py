"""runPolicy (suspend, deadline, TTL, cleanup), scheduling timeouts, spec changes, invalid objects."""

from __future__ import annotations

import pytest

from dtrain_operator.api import contract
from tests.builders import a_cpu_job

from .cluster import Cluster

NS = "default"
pytestmark = pytest.mark.real_apiserver


async def test_suspend_deletes_the_gang_and_resume_starts_it_again(operated: Cluster):
    await operated.apply(a_cpu_job("paused").with_nodes(2).as_dict())
    await operated.run_all(NS, "paused", 2)
    await operated.phase(NS, "paused", "Running")

    await operated.patch_job(NS, "paused", {"spec": {"runPolicy": {"suspend": True}}})
    await operated.phase(NS, "paused", "Suspended")
    await operated.eventually(lambda: operated.pods(NS, "paused") == [], "no pods while suspended")
    assert operated.condition(NS, "paused", "Suspended")["status"] == "True"
    assert operated.status(NS, "paused")["restarts"] == 0

    await operated.patch_job(NS, "paused", {"spec": {"runPolicy": {"suspend": False}}})
    pods = await operated.run_all(NS, "paused", 2)
    assert {p["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for p in pods} == {"0"}
    await operated.phase(NS, "paused", "Running")
    assert operated.condition(NS, "paused", "Suspended")["status"] == "False"
    assert operated.status(NS, "paused")["restarts"] == 0
    await operated.event_reasons(NS, "paused", ["Running", "Suspended", "Running"])


async def test_a_job_created_suspended_creates_no_pods(operated: Cluster):
    await operated.apply(a_cpu_job("queued").with_nodes(2).suspended().as_dict())
    await operated.phase(NS, "queued", "Suspended")
    await operated.apply(a_cpu_job("marker").with_nodes(1).as_dict())
    await operated.eventually(lambda: operated.pods(NS, "marker"), "a later job's pods")
    assert operated.pods(NS, "queued") == []
    await operated.patch_job(NS, "queued", {"spec": {"runPolicy": {"suspend": False}}})
    await operated.eventually(lambda: len(operated.pods(NS, "queued")) == 2, "pods after admission")


async def test_active_deadline_fails_the_job_and_stops_its_pods(operated: Cluster):
    await operated.apply(a_cpu_job("capped").with_nodes(2).with_deadline(2).as_dict())
    await operated.run_all(NS, "capped", 2)
    await operated.phase(NS, "capped", "Running")
    await operated.phase(NS, "capped", "Failed", timeout=10)
    failed = operated.condition(NS, "capped", "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    assert "activeDeadlineSeconds (2 s)" in failed["message"]
    await operated.eventually(lambda: operated.pods(NS, "capped") == [], "running pods deleted")


async def test_ttl_after_finished_deletes_the_job_and_its_children(operated: Cluster):
    await operated.apply(a_cpu_job("shortlived").with_nodes(2).with_ttl(1).as_dict())
    await operated.run_all(NS, "shortlived", 2)
    await operated.exit(NS, "shortlived-1", 0)
    await operated.exit(NS, "shortlived-0", 0)
    # completionTime has whole seconds, so a 1 s TTL may delete the job before a poll sees it Succeeded:
    # its Events (which have no owner) keep what it went through.
    await operated.eventually(lambda: operated.job(NS, "shortlived") is None, "the job deleted", timeout=40)
    assert [e["reason"] for e in operated.events(NS, "shortlived")][-1] == "Succeeded"
    await operated.eventually(
        lambda: not operated.objects("v1/pods", NS, "shortlived") and not operated.objects("v1/services", NS, "shortlived")
        and not operated.objects("v1/configmaps", NS, "shortlived"),
        "children collected through their owner references",
    )


@pytest.mark.parametrize(
    "policy,left",
    [("All", []), ("Running", ["cleanup-1"]), ("None", ["cleanup-0", "cleanup-1", "cleanup-2"])],
)
async def test_clean_pod_policy(operated: Cluster, policy: str, left: list[str]):
    job = a_cpu_job("cleanup").with_nodes(3).with_restart_policy("Never").with_clean_pod_policy(policy)
    await operated.apply(job.as_dict())
    await operated.run_all(NS, "cleanup", 3)
    await operated.phase(NS, "cleanup", "Running")
    await operated.exit(NS, "cleanup-1", 2)
    await operated.phase(NS, "cleanup", "Failed")
    await operated.eventually(lambda: [p["metadata"]["name"] for p in operated.pods(NS, "cleanup")] == left,
                              f"pods {left} left by cleanPodPolicy {policy}")


async def test_pods_pending_too_long_are_named_with_their_reason(operated: Cluster):
    await operated.apply(a_cpu_job("starved").with_nodes(2).on_gpus(8).with_schedule_timeout(1).as_dict())
    pods = await operated.eventually(lambda: len(p := operated.pods(NS, "starved")) == 2 and p, "2 pods")
    message = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    for pod in pods:
        await operated.unschedulable(NS, pod["metadata"]["name"], message)
    # Under load the timeout can pass before the second pod has its reason: the condition
    # follows the pods' reasons as they change, so wait until it names both.
    both = [f"starved-{rank}: Unschedulable: {message}" for rank in range(2)]
    condition = await operated.eventually(
        lambda: (c := operated.condition(NS, "starved", "PodsPending"))
        and c["status"] == "True"
        and all(text in c["message"] for text in both)
        and c,
        "the PodsPending condition naming both pods and their reason", timeout=10,
    )
    assert condition["reason"] == "PodsPendingTooLong"
    assert operated.status(NS, "starved")["phase"] == "Pending"
    await operated.eventually(lambda: "PodsPending" in [e["reason"] for e in operated.events(NS, "starved")],
                              "a PodsPending event")
    await operated.run_all(NS, "starved", 2)
    await operated.phase(NS, "starved", "Running")
    assert operated.condition(NS, "starved", "PodsPending")["status"] == "False"


@pytest.mark.emulator("what the CRD refuses (stored under an older CRD)")
async def test_a_change_to_an_immutable_field_is_reported_not_applied(operated: Cluster):
    """An edit of volumes or of a running job's scheduling that reaches the operator (a CRD from before
    its transition rules, which refuse it today) is compared with the spec it accepted and reported
    instead of applied."""
    await operated.apply(a_cpu_job("fixed").with_nodes(2).as_dict())
    await operated.run_all(NS, "fixed", 2)
    await operated.phase(NS, "fixed", "Running")

    volume = {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}
    await operated.patch_job(NS, "fixed", {"spec": {"volumes": [volume], "scheduling": {"affinity": {"nodeAffinity": {}}}}})
    condition = await operated.eventually(
        lambda: (c := operated.condition(NS, "fixed", "SpecImmutable")) and c["status"] == "True" and c,
        "the SpecImmutable condition",
    )
    assert condition["reason"] == "ImmutableFieldChanged"
    assert "spec.volumes" in condition["message"] and "spec.scheduling.affinity" in condition["message"]
    status = operated.status(NS, "fixed")
    assert (status["phase"], status["observedGeneration"]) == ("Running", 2)
    assert len(operated.pods(NS, "fixed")) == 2
    events = await operated.event_reasons(NS, "fixed", ["Running", "SpecImmutable"])
    assert events[-1]["type"] == "Warning"

    # A gang restart still runs the spec the job was created with.
    await operated.exit(NS, "fixed-0", 1)
    await operated.eventually(lambda: operated.status(NS, "fixed").get("restarts") == 1, "a restart")
    pods = await operated.eventually(
        lambda: len(p := operated.pods(NS, "fixed")) == 2
        and {x["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for x in p} == {"1"} and p,
        "two pods of the new gang",
    )
    assert all(not any(v["name"] == "data" for v in p["spec"].get("volumes", [])) for p in pods)

    await operated.patch_job(NS, "fixed", {"spec": {"volumes": None, "scheduling": {"affinity": None}}})
    await operated.eventually(lambda: operated.condition(NS, "fixed", "SpecImmutable")["status"] == "False",
                              "the condition cleared by the revert")


async def test_mutable_fields_can_change(operated: Cluster):
    await operated.apply(a_cpu_job("mutable").with_nodes(1).as_dict())
    await operated.run_all(NS, "mutable", 1)
    await operated.phase(NS, "mutable", "Running")
    await operated.patch_job(NS, "mutable", {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 600}}})
    await operated.eventually(lambda: operated.status(NS, "mutable").get("observedGeneration") == 2, "generation 2")
    assert operated.condition(NS, "mutable", "SpecImmutable") is None


@pytest.mark.emulator("what the CRD refuses (stored under an older CRD)")
async def test_an_invalid_object_fails_with_the_messages_and_others_run(operated: Cluster):
    """What reaches the operator without the CRD's checks (a CRD from before its rules) fails with the model's messages."""
    bad = a_cpu_job("bad").with_spec(nodes=0).with_spec(trainer={"batchSize": 8, "maxEpoch": 3}).as_dict()
    await operated.apply(bad)
    await operated.apply(a_cpu_job("good").with_nodes(2).as_dict())
    await operated.phase(NS, "bad", "Failed")
    failed = operated.condition(NS, "bad", "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.nodes: Input should be greater than or equal to 1" in failed["message"]
    assert "spec.trainer.maxEpoch: unknown field; did you mean 'maxEpochs'?" in failed["message"]
    await operated.run_all(NS, "good", 2)
    await operated.phase(NS, "good", "Running")
    for resource in ("v1/pods", "v1/services", "v1/configmaps"):
        assert operated.objects(resource, NS, "bad") == []
    await operated.event_reasons(NS, "bad", ["Failed"])

    # Fixed in place (nothing was ever created for it), it starts.
    await operated.patch_job(NS, "bad", {"spec": {"nodes": 1, "trainer": {"maxEpoch": None, "maxEpochs": 3}}})
    await operated.eventually(lambda: len(operated.pods(NS, "bad")) == 1, "the fixed job's pod")
    assert operated.status(NS, "bad")["phase"] == "Pending"


@pytest.mark.emulator("what the CRD refuses (stored under an older CRD)")
async def test_an_invalid_edit_of_a_running_job_keeps_it_running(operated: Cluster):
    await operated.apply(a_cpu_job("steady").with_nodes(2).as_dict())
    await operated.run_all(NS, "steady", 2)
    await operated.phase(NS, "steady", "Running")
    await operated.patch_job(NS, "steady", {"spec": {"devicesPerNode": 0}})
    condition = await operated.eventually(
        lambda: (c := operated.condition(NS, "steady", "SpecImmutable")) and c["status"] == "True" and c,
        "the condition about the invalid edit",
    )
    assert condition["reason"] == "InvalidSpecChange"
    assert "spec.devicesPerNode" in condition["message"]
    assert operated.status(NS, "steady")["phase"] == "Running"


@pytest.mark.emulator("Volcano's and scheduler-plugins' PodGroup CRDs")
@pytest.mark.parametrize(
    "scheduler,api_version",
    [("volcano", "scheduling.volcano.sh/v1beta1"), ("scheduler-plugins-scheduler", "scheduling.x-k8s.io/v1alpha1")],
)
async def test_gang_scheduling_creates_a_pod_group(operated: Cluster, scheduler: str, api_version: str):
    await operated.apply(a_cpu_job("gang").with_nodes(3).with_gang_scheduling(scheduler).as_dict())
    pods = await operated.eventually(lambda: len(p := operated.pods(NS, "gang")) == 3 and p, "3 pods")
    (group,) = [g for g in operated.objects(f"{api_version}/podgroups", NS)]
    assert group["metadata"]["name"] == "gang"
    assert group["spec"]["minMember"] == 3
    assert group["metadata"]["ownerReferences"][0]["name"] == "gang"
    for pod in pods:
        assert pod["spec"]["schedulerName"] == scheduler
        joined = {**pod["metadata"].get("annotations", {}), **pod["metadata"]["labels"]}
        assert "gang" in (joined.get("scheduling.k8s.io/group-name"), joined.get("scheduling.x-k8s.io/pod-group"))
