"""refusals.py: which refused create is which, and the backoff read from the status alone."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from dtrain_operator.api import DistributedTrainingStatus
from dtrain_operator.controller import refusals

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    "status,message,reason,fails",
    [
        (403, 'pods "a-0" is forbidden: exceeded quota: q, requested: cpu=8, used: cpu=0, limited: cpu=4', "QuotaExceeded", False),
        (403, 'pods "a-0" is forbidden: violates PodSecurity "baseline:latest": host namespaces (hostNetwork=true)',
         "PodSecurityForbidden", False),
        (403, 'pods "a-0" is forbidden: error looking up service account ns/sa: serviceaccount "sa" not found',
         "ServiceAccountMissing", False),
        (403, 'pods is forbidden: User "system:serviceaccount:x:y" cannot create resource "pods"', "CreateForbidden", False),
        (422, 'Pod "a-0" is invalid: spec.containers[0].image: Required value', "InvalidPod", True),
        (400, "the body is not a JSON object", "CreateRefused", False),
    ],
)
def test_classify(status, message, reason, fails):
    refusal = refusals.classify("Pod", "ns/a-0", status, message)
    assert refusal is not None
    assert (refusal.reason, refusal.fails_job) == (reason, fails)
    assert message in refusal.message and "Pod ns/a-0" in refusal.message


@pytest.mark.parametrize(
    "api_version,fix",
    [
        ("scheduling.k8s.io/v1alpha2", (
            "Kubernetes 1.36+ with the feature gates GenericWorkload and GangScheduling and "
            "--runtime-config=scheduling.k8s.io/v1alpha2=true, or set spec.scheduling.gang.provider to volcano or "
            "scheduler-plugins")),
        ("scheduling.volcano.sh/v1beta1", "Volcano installed, or set spec.scheduling.gang.provider to kubernetes"),
        ("scheduling.x-k8s.io/v1alpha1", "scheduler-plugins' PodGroup CRD"),
    ],
)
def test_a_pod_group_api_the_cluster_does_not_serve_names_the_fix_and_is_retried(api_version, fix):
    refusal = refusals.classify("PodGroup", "ns/a", 404, "the server could not find the requested resource", api_version)
    assert refusal is not None
    assert (refusal.reason, refusal.fails_job) == ("GangSchedulingUnavailable", False)
    assert f"This cluster does not serve {api_version} PodGroups: {fix}" in refusal.message
    assert "the server could not find the requested resource" in refusal.message and refusals.BACKOFF in refusal.message
    # Any other 404 is no statement about gang scheduling: a PodGroup deleted between a 409 and its read-back.
    gone = refusals.classify("PodGroup", "ns/a", 404, 'podgroups.scheduling.k8s.io "a" not found', api_version)
    assert gone is not None and gone.reason == "CreateRefused"


@pytest.mark.parametrize("status", [409, 429, 500, 503, 0, 201])
def test_not_a_refusal(status):
    assert refusals.classify("Pod", "ns/a-0", status, "x") is None


def test_backoff_doubles_from_the_condition_and_stops_at_five_minutes():
    status = refusals.refused_status(DistributedTrainingStatus(), refusals.classify("Pod", "n/p", 403, "exceeded quota"), NOW)
    assert refusals.is_refused(status)
    delays = [refusals.retry_after(status, NOW + timedelta(seconds=s)) for s in (0, 5, 10, 20, 40, 1000)]
    assert delays == [5, 5, 10, 20, 40, 300]
    again = refusals.refused_status(status, refusals.classify("Pod", "n/p", 403, "exceeded quota"), NOW + timedelta(seconds=60))
    assert again.conditions[0].last_transition_time == status.conditions[0].last_transition_time
    cleared = refusals.cleared_status(again, NOW + timedelta(seconds=90))
    assert not refusals.is_refused(cleared)


def test_an_invalid_object_fails_the_job():
    refusal = refusals.classify("Service", "n/s", 422, 'Service "s" is invalid: spec.ports[0].port: Invalid value: 0')
    status = refusals.refused_status(DistributedTrainingStatus(phase="Pending"), refusal, NOW)
    assert status.phase == "Failed" and status.completion_time
    failed = next(c for c in status.conditions if c.type == "Failed")
    assert failed.reason == "InvalidService" and "spec.ports[0].port" in failed.message
