"""A create the API server refuses is a condition and a Warning Event with the API server's own
message, not a job Pending forever: each refusal injected as a real cluster's admission makes it."""

from __future__ import annotations

import asyncio

from dtrain_operator.controller import refusals
from tests.builders import a_cpu_job

from .cluster import Cluster
from .operator_process import OPERATOR_AGENTS

NS = "default"


def refused(cluster: Cluster, name: str):
    condition = cluster.condition(NS, name, refusals.CREATE_REFUSED)
    return condition if condition and condition["status"] == "True" else None


async def test_pod_security_forbidding_host_network_and_host_path(operated: Cluster):
    operated.refusals.pod_security("baseline")
    volume = {"name": "nvme", "hostPath": {"path": "/mnt/nvme"}}
    job = a_cpu_job("hostnet").with_nodes(2).with_spec(hostNetwork=True).with_spec(volumes=[volume]).as_dict()
    await operated.apply(job)
    condition = await operated.eventually(lambda: refused(operated, "hostnet"), "the CreateRefused condition")
    assert condition["reason"] == refusals.REASON_POD_SECURITY
    assert 'violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true), hostPath volumes (volume "nvme")' \
        in condition["message"]
    assert "spec.hostNetwork" in condition["message"]
    events = await operated.eventually(
        lambda: [e for e in operated.events(NS, "hostnet") if e["reason"] == refusals.REASON_POD_SECURITY],
        "the Warning Event",
    )
    assert events[0]["type"] == "Warning" and "violates PodSecurity" in events[0]["message"]
    assert operated.status(NS, "hostnet")["phase"] == "Pending"


async def test_quota_is_retried_with_backoff_and_says_so(operated: Cluster):
    quota = operated.refusals.quota("requests.nvidia.com/gpu", "4")
    await operated.apply(a_cpu_job("big").with_nodes(2).on_gpus(4).as_dict())
    condition = await operated.eventually(lambda: refused(operated, "big"), "the CreateRefused condition")
    assert condition["reason"] == refusals.REASON_QUOTA
    assert "exceeded quota: team-quota, requested: requests.nvidia.com/gpu=8" in condition["message"]
    assert "retries with a backoff" in condition["message"]
    attempts = operated.refusals.refused
    # The quota frees up: the next retry creates the pods and the condition clears.
    operated.refusals.remove(quota)
    pods = await operated.eventually(lambda: len(p := operated.pods(NS, "big")) == 2 and p, "2 pods", timeout=30)
    assert len(pods) == 2 and attempts >= 1
    await operated.eventually(
        lambda: operated.condition(NS, "big", refusals.CREATE_REFUSED)["status"] == "False", "the condition cleared"
    )
    events = [e for e in operated.events(NS, "big") if e["reason"] == refusals.REASON_QUOTA]
    assert len(events) == 1 and events[0]["type"] == "Warning"


async def test_quota_retries_back_off(operated: Cluster):
    operated.refusals.quota()
    await operated.apply(a_cpu_job("wait").with_nodes(1).on_gpus(8).as_dict())
    await operated.eventually(lambda: refused(operated, "wait"), "the CreateRefused condition")
    first = operated.refusals.refused
    await asyncio.sleep(4)
    # The first retries come within seconds, not in a hot loop: a handful in 4 s.
    assert operated.refusals.refused - first <= 3


async def test_a_missing_service_account(operated: Cluster):
    operated.refusals.missing_service_account()
    await operated.apply(a_cpu_job("nosa").with_nodes(1).as_dict())
    condition = await operated.eventually(lambda: refused(operated, "nosa"), "the CreateRefused condition")
    assert condition["reason"] == refusals.REASON_SERVICE_ACCOUNT
    assert ('error looking up service account default/dtrain-trainer: serviceaccount "dtrain-trainer" not found'
            in condition["message"])


async def test_a_child_the_api_server_refuses_fails_the_job_before_anything_runs(operated: Cluster):
    """The dry run of the job's children when it is accepted (core.server_check): the server's own words, the
    child named, nothing created, no restart spent, and the verdict asked once, not at every reconcile."""
    operated.refusals.invalid("pods", "spec.containers[0].resources.requests",
                              'Invalid value: "64": must be less than or equal to cpu limit of 8')
    await operated.apply(a_cpu_job("toobig").with_nodes(2).as_dict())
    await operated.phase(NS, "toobig", "Failed")
    failed = operated.condition(NS, "toobig", "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "the API server refuses the job's Pod toobig-1 (the worker pod of node 1)" in failed["message"]
    assert 'Pod "toobig-1" is invalid: spec.containers[0].resources.requests: Invalid value: "64"' in failed["message"]
    assert operated.pod_creations(NS, "toobig-0") == operated.pod_creations(NS, "toobig-1") == 0
    assert operated.status(NS, "toobig").get("restarts", 0) == 0
    dry_runs = operated.api.count_calls(OPERATOR_AGENTS, verb="create", resource="pods")
    await operated.patch_job(NS, "toobig", {"metadata": {"labels": {"touched": "yes"}}})  # another reconcile
    await asyncio.sleep(1)
    assert operated.api.count_calls(OPERATOR_AGENTS, verb="create", resource="pods") == dry_runs


async def test_an_invalid_object_only_its_create_meets_fails_the_job_with_its_own_reason(operated: Cluster):
    """A refusal the dry run did not meet (a webhook that takes no part in dry runs): the create's 422."""
    operated.refusals.invalid("pods", "spec.containers[0].resources.requests",
                              'Invalid value: "64": must be less than or equal to cpu limit of 8', on_dry_run=False)
    await operated.apply(a_cpu_job("toobig").with_nodes(2).as_dict())
    await operated.phase(NS, "toobig", "Failed")
    failed = operated.condition(NS, "toobig", "Failed")
    assert failed["reason"] == "InvalidPod"
    assert 'Pod "toobig-' in failed["message"] and "must be less than or equal to cpu limit of 8" in failed["message"]
    events = await operated.eventually(
        lambda: [e for e in operated.events(NS, "toobig") if e["reason"] == "InvalidPod"], "the InvalidPod event"
    )
    assert events[0]["type"] == "Warning"
    count = operated.refusals.refused
    await asyncio.sleep(1)
    assert operated.refusals.refused == count, "a failed job is not retried"


async def test_a_refused_service_fails_the_job_before_any_pod(operated: Cluster):
    """The Service is created before any pod, for real (no dry run of it): its create is the verdict."""
    operated.refusals.invalid("services", "spec.ports[0].port", "Invalid value: 0: must be between 1 and 65535")
    await operated.apply(a_cpu_job("svc").with_nodes(1).as_dict())
    await operated.phase(NS, "svc", "Failed")
    failed = operated.condition(NS, "svc", "Failed")
    assert failed["reason"] == "InvalidService" and "must be between 1 and 65535" in failed["message"]
    assert operated.pods(NS, "svc") == []


async def test_no_pod_without_its_kubernetes_pod_group_until_the_cluster_serves_it(operated: Cluster):
    """gang.provider kubernetes on a cluster without scheduling.k8s.io/v1alpha2 (before 1.36, or without its
    feature gates): such an API server would drop spec.schedulingGroup from the pods and place them one by
    one, so none is created; the condition and a Warning Event say what the cluster needs, and the job
    starts at a retry once the cluster has it."""
    unserved = operated.refusals.not_served("scheduling.k8s.io/v1alpha2", "podgroups")
    await operated.apply(a_cpu_job("native").with_nodes(2).with_native_gang_scheduling().as_dict())
    condition = await operated.eventually(lambda: refused(operated, "native"), "the CreateRefused condition")
    assert condition["reason"] == refusals.REASON_GANG_UNAVAILABLE
    assert ("This cluster does not serve scheduling.k8s.io/v1alpha2 PodGroups: Kubernetes 1.36+ with the feature gates "
            "GenericWorkload and GangScheduling and --runtime-config=scheduling.k8s.io/v1alpha2=true, or set "
            "spec.scheduling.gang.provider to volcano or scheduler-plugins") in condition["message"]
    events = await operated.eventually(
        lambda: [e for e in operated.events(NS, "native") if e["reason"] == refusals.REASON_GANG_UNAVAILABLE],
        "the Warning Event",
    )
    assert events[0]["type"] == "Warning"
    assert operated.pod_creations(NS, "native-0") == operated.pod_creations(NS, "native-1") == 0
    assert operated.status(NS, "native")["phase"] == "Pending"
    # The cluster gets the API: the next retry creates the PodGroup, then the pods that name it.
    operated.refusals.remove(unserved)
    pods = await operated.eventually(lambda: len(p := operated.pods(NS, "native")) == 2 and p, "2 pods", timeout=30)
    (group,) = operated.objects("scheduling.k8s.io/v1alpha2/podgroups", NS, "native")
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": 2}}}
    assert group["metadata"]["ownerReferences"][0]["name"] == "native"
    for pod in pods:
        assert pod["spec"]["schedulingGroup"] == {"podGroupName": "native"} and "schedulerName" not in pod["spec"]
    await operated.eventually(
        lambda: operated.condition(NS, "native", refusals.CREATE_REFUSED)["status"] == "False", "the condition cleared"
    )
