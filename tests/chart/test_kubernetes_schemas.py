"""Every object the chart renders, and every object the operator renders for the example jobs,
is valid Kubernetes (1.33 and 1.35; Kubernetes' own gang scheduling, 1.36), strict about unknown fields."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from dtrain_operator.core.render import render_children, render_worker_pod
from tests.chart.helm import MONITORING_API, helm_template
from tests.chart.jobs import all_jobs, example_jobs
from tests.chart.kube_schemas import validate_object
from tests.chart.value_sets import VALUE_SETS

JOBS = all_jobs()


@pytest.mark.parametrize("name", VALUE_SETS)
def test_chart_objects_are_valid_kubernetes(name: str) -> None:
    values, api_versions = VALUE_SETS[name]
    for obj in helm_template(values, api_versions=api_versions):
        validate_object(obj)


def test_every_example_is_covered() -> None:
    assert {"quickstart.yaml", "resnet50-imagenet.yaml"} <= set(example_jobs())


@pytest.mark.parametrize("name", JOBS)
def test_operator_children_are_valid_kubernetes(name: str) -> None:
    children = render_children(JOBS[name])
    for obj in children:
        validate_object(obj)
    # Later gangs render the same objects with another generation label.
    for obj in render_children(JOBS[name], gang_generation=3):
        validate_object(obj)


def test_every_kind_the_operator_renders_is_checked() -> None:
    kinds = {(obj["apiVersion"], obj["kind"]) for job in JOBS.values() for obj in render_children(job)}
    assert kinds == {
        ("v1", "Service"),
        ("v1", "Pod"),
        ("batch/v1", "Job"),
        ("scheduling.k8s.io/v1alpha2", "PodGroup"),
        ("scheduling.volcano.sh/v1beta1", "PodGroup"),
        ("scheduling.x-k8s.io/v1alpha1", "PodGroup"),
    }


def test_validation_rejects_unknown_and_mistyped_fields() -> None:
    """The checks above can fail: a misspelt field or a wrong type is caught."""
    pod = render_worker_pod(JOBS["quickstart.yaml"], 0)
    misspelt = copy.deepcopy(pod)
    misspelt["spec"]["hostNetwrok"] = True
    with pytest.raises(AssertionError, match="hostNetwrok"):
        validate_object(misspelt)
    mistyped = copy.deepcopy(pod)
    mistyped["spec"]["containers"][0]["ports"][0]["containerPort"] = "29500"
    with pytest.raises(AssertionError, match="containerPort"):
        validate_object(mistyped)
    (pod_group,) = [o for o in render_children(JOBS["gang-volcano"]) if o["kind"] == "PodGroup"]
    pod_group["spec"]["minMembers"] = 2
    with pytest.raises(jsonschema.ValidationError, match="minMembers"):
        validate_object(pod_group)
    (native,) = [o for o in render_children(JOBS["gang-kubernetes"]) if o["kind"] == "PodGroup"]
    native["spec"]["schedulingPolicy"]["gang"]["minMember"] = 2
    with pytest.raises(AssertionError, match="minMember"):
        validate_object(native)
    (monitor,) = [
        o
        for o in helm_template(VALUE_SETS["service-monitor"][0], api_versions=[MONITORING_API])
        if o["kind"] == "ServiceMonitor"
    ]
    monitor["spec"]["endpoints"][0]["interval"] = "30 seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(monitor)
