"""The gang scenarios' jobs (scenarios.gang.gpu_job) without a cluster: admitted as the API server admits
them (the session's kube-apiserver, by dry run), read and rendered as the operator does. Every worker asks for
one nvidia.com/gpu (and, seeing no CUDA device, trains on the CPU), the gang job's workers name their
provider's PodGroup of all of them (Kubernetes' own, or scheduler-plugins' for its coscheduling
scheduler), and the e2e cluster has one GPU too few for them."""

from __future__ import annotations

import pytest
import yaml
from localcluster import schedulers

from dtrain_operator.api import DistributedTraining
from dtrain_operator.core import pod_groups, render
from tests.cluster.kube import REPO
from tests.cluster.scenarios import SCENARIOS
from tests.cluster.scenarios.common import E2E_GPUS_PER_NODE, E2E_NODES, GPU, e2e_cluster_arguments
from tests.cluster.scenarios.gang import COSCHEDULING_GANG, GANG_NODES, NATIVE_GANG, gpu_job
from tests.kube_admission import KubeAdmission

GANG = {"gang": {"enabled": True, "provider": "kubernetes", "scheduleTimeoutSeconds": 5}}


@pytest.mark.parametrize("scheduling", [{"gang": {"scheduleTimeoutSeconds": 5}}, GANG, NATIVE_GANG.scheduling,
                                        COSCHEDULING_GANG.scheduling])
def test_each_worker_asks_for_one_gpu(admission: KubeAdmission, scheduling):
    stored = admission.check(gpu_job("e2e-gang", scheduling=scheduling))  # kubectl apply's admission
    job = DistributedTraining.model_validate(stored)
    assert (job.spec.accelerator, job.spec.devices_per_node) == ("gpu", 1)
    pods = render.render_workers(job)
    assert len(pods) == GANG_NODES
    assert all(p["spec"]["containers"][0]["resources"]["limits"] == {GPU: 1} for p in pods)


def test_the_gang_names_kubernetes_own_pod_group_of_every_worker():
    job = DistributedTraining.model_validate(gpu_job("e2e-gang", scheduling=GANG))
    group = pod_groups.render_pod_group(job)
    assert group is not None and group["apiVersion"] == "scheduling.k8s.io/v1alpha2"
    assert group["spec"] == {"schedulingPolicy": {"gang": {"minCount": GANG_NODES}}}
    assert {p["spec"]["schedulingGroup"]["podGroupName"] for p in render.render_workers(job)} == {
        group["metadata"]["name"]}


def test_without_a_gang_there_is_no_pod_group():
    job = DistributedTraining.model_validate(gpu_job("e2e-nogang", scheduling={"gang": {"scheduleTimeoutSeconds": 5}}))
    assert pod_groups.render_pod_group(job) is None
    assert all("schedulingGroup" not in p["spec"] for p in render.render_workers(job))


def test_the_e2e_cluster_has_one_gpu_too_few_for_the_gang():
    assert e2e_cluster_arguments() == ["--nodes", str(E2E_NODES), "--gpus-per-node", str(E2E_GPUS_PER_NODE)]
    assert E2E_NODES * E2E_GPUS_PER_NODE == GANG_NODES - 1


def test_the_coscheduling_gang_names_scheduler_plugins_pod_group_of_every_worker(admission: KubeAdmission):
    stored = admission.check(gpu_job("e2e-cosched", scheduling=COSCHEDULING_GANG.scheduling))
    stored["spec"]["nodes"] = E2E_NODES + 2  # after the gang scenario's join: 4 workers on 3 nodes
    job = DistributedTraining.model_validate(stored)
    group = pod_groups.render_pod_group(job)
    assert group is not None and group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {"minMember": E2E_NODES + 2, "scheduleTimeoutSeconds": 5}
    pods = render.render_workers(job)
    assert {COSCHEDULING_GANG.group_of(p) for p in pods} == {group["metadata"]["name"]}
    assert {p["spec"]["schedulerName"] for p in pods} == {"scheduler-plugins-scheduler"}
    assert {NATIVE_GANG.group_of(p) for p in pods} == {None}


def test_the_native_gang_names_no_scheduler_plugins_group():
    pods = render.render_workers(DistributedTraining.model_validate(gpu_job("e2e-gang", scheduling=GANG)))
    assert {COSCHEDULING_GANG.group_of(p) for p in pods} == {None}
    assert all("schedulerName" not in p["spec"] for p in pods)


def test_the_e2e_cluster_starts_the_coscheduling_scheduler_only_for_its_scenario():
    every = [key for key, _, _ in SCENARIOS]
    assert e2e_cluster_arguments(every)[-2:] == ["--schedulers", "coscheduling"]
    assert e2e_cluster_arguments(["gang-coscheduling"])[-2:] == ["--schedulers", "coscheduling"]
    assert e2e_cluster_arguments(["gang", "quickstart"]) == e2e_cluster_arguments()
    # Last: gang needs exactly the 2 nodes it starts with and leaves a third joined; elastic needs 3 (it joins them
    # when run alone) and leaves them; coscheduling's gang is one larger than the nodes there are.
    assert every[-3:] == ["gang", "elastic", "gang-coscheduling"]


def test_the_docs_coscheduling_lines_are_what_the_scenario_applies():
    page = (REPO / "docs" / "scheduling.md").read_text()
    section = page[page.index("## Gang scheduling"):page.index("## Queueing with Kueue")]
    (block,) = [b for b in section.split("```yaml\n")[1:] if "scheduler-plugins-scheduler" in b]
    scheduling = yaml.safe_load(block.split("```")[0])["spec"]["scheduling"]
    expected = COSCHEDULING_GANG.scheduling
    assert scheduling["schedulerName"] == expected["schedulerName"] == schedulers.SCHEDULER_NAME
    assert scheduling["gang"] == {k: v for k, v in expected["gang"].items() if k != "scheduleTimeoutSeconds"}
    assert f"make cluster NODES=3 GPUS_PER_NODE=1 SCHEDULERS={schedulers.KNOWN[0]}" in section
