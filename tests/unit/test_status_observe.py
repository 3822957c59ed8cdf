"""Observing pods and Jobs: what the pure status functions read of a worker pod and the engine Job, and when a
deleted pod counts as stuck terminating (split from test_status.py, which computes statuses from these)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from dtrain_operator.api import contract
from dtrain_operator.core.gang_state import stuck_terminating
from dtrain_operator.core.observation import Limits, Observed, PodObservation, format_time
from dtrain_operator.core.status.compute import compute_status
from dtrain_operator.core.status.observe import observe_engine_job, observe_pod
from tests.builders import (
    JOB_UID,
    NOW,
    a_cpu_job,
    a_worker,
    accepted_status,
)

JOB = a_cpu_job().in_namespace("ml").with_nodes(3).with_uid().at_generation(1).as_model()
"""The job these tests observe: three CPU workers, no engine step (test_status.py's MNIST)."""


def raw_pod(status: dict, **meta: Any) -> dict:
    return {
        "metadata": {"name": "mnist-1", "uid": "u1", "resourceVersion": "7", "creationTimestamp": "2026-05-01T11:50:00Z",
                     "labels": {contract.LABEL_ROLE: "worker", contract.LABEL_NODE_RANK: "1",
                                contract.LABEL_GANG_GENERATION: "2"},
                     "ownerReferences": [{"uid": JOB_UID, "controller": True}], **meta},
        "spec": {},
        "status": status,
    }


def terminated(code: int, reason: str, message: str = "") -> dict:
    state = {"terminated": {"exitCode": code, "reason": reason, "message": message}}
    return {"containerStatuses": [{"name": "trainer", "image": "i", "imageID": "i@sha256:0", "ready": False,
                                   "restartCount": 0, "state": state}]}


@pytest.mark.parametrize(
    "status,meta,expected",
    [
        ({"phase": "Running"}, {}, {"phase": "Running", "exit_code": None, "lost": False}),
        ({"phase": "Failed", **terminated(1, "Error", "Traceback ...")}, {},
         {"phase": "Failed", "exit_code": 1, "reason": "Error", "message": "Traceback ...", "lost": False}),
        ({"phase": "Failed", **terminated(137, "OOMKilled")}, {},
         {"exit_code": 137, "reason": "OOMKilled", "lost": False}),
        ({"phase": "Failed", "reason": "Evicted", "message": "low on memory", **terminated(137, "ContainerStatusUnknown")},
         {}, {"exit_code": None, "reason": "Evicted", "message": "low on memory", "lost": True}),
        ({"phase": "Failed", "conditions": [{"type": "DisruptionTarget", "status": "True",
                                             "reason": "PreemptionByScheduler", "message": "preempted"}],
          **terminated(143, "Error")}, {}, {"exit_code": None, "reason": "PreemptionByScheduler", "lost": True}),
        ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                              "message": "0/4 nodes"}]}, {},
         {"scheduled": False, "pending_reason": "Unschedulable: 0/4 nodes"}),
        ({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
          "containerStatuses": [{"name": "trainer", "state": {"waiting": {"reason": "ImagePullBackOff",
                                                                          "message": "not found"}}}]}, {},
         {"scheduled": True, "pending_reason": "ImagePullBackOff: not found"}),
        ({"phase": "Running"}, {"deletionTimestamp": "2026-05-01T12:00:00Z"}, {"deleting": True}),
    ],
    ids=["running", "exit-1", "oom", "evicted", "preempted", "unschedulable", "image-pull", "deleting"],
)
def test_observe_pod(status, meta, expected):
    observed = observe_pod(raw_pod(status, **meta))
    assert (observed.rank, observed.generation, observed.owner_uid) == (1, 2, JOB_UID)
    assert {k: getattr(observed, k) for k in expected} == expected


def test_a_pod_deleted_with_no_grace_while_it_ran_is_force_deleted():
    """A lost node's pod, deleted with grace 0 by the pod GC or by hand: nothing waits for its processes. A pod that
    ended has grace 0 too (the API server gives it none): it is not."""
    ends = format_time(NOW)
    assert observe_pod(raw_pod({"phase": "Running"}, deletionTimestamp=ends, deletionGracePeriodSeconds=0)).force_deleted
    assert not observe_pod(raw_pod({"phase": "Running"}, deletionTimestamp=ends, deletionGracePeriodSeconds=30)).force_deleted
    assert not observe_pod(raw_pod({"phase": "Failed"}, deletionTimestamp=ends, deletionGracePeriodSeconds=0)).force_deleted
    assert not observe_pod(raw_pod({"phase": "Running"})).force_deleted


def test_a_pod_is_stuck_terminating_only_past_the_end_of_its_grace_period():
    """A real API server sets a deleted pod's deletionTimestamp to the request's time plus its grace period
    (deletionGracePeriodSeconds): the pod may use all of it, and --stuck-terminating-timeout counts after it."""
    requested = NOW - timedelta(seconds=700)

    def deleted(grace: int) -> PodObservation:
        ends = format_time(requested + timedelta(seconds=grace))
        return observe_pod(raw_pod({"phase": "Running"}, deletionTimestamp=ends, deletionGracePeriodSeconds=grace))

    limits = Limits(stuck_terminating_seconds=150)
    assert stuck_terminating([deleted(600)], NOW, limits) == []  # 100 s past its grace period
    assert [p.name for p in stuck_terminating([deleted(30)], NOW, limits)] == ["mnist-1"]  # 670 s past it
    old_gang = replace(deleted(30), generation=0, rank=1, name="mnist-1")
    status = compute_status(JOB, Observed(workers=(a_worker(0, "Failed", exit_code=1), old_gang)),
                            accepted_status(JOB, "Restarting"), NOW, limits=limits)
    stuck = next(c for c in status.conditions if c.type == "PodsStuckTerminating")
    assert stuck.message.startswith("mnist-1: still terminating 150 s after the end of the grace period")


@pytest.mark.parametrize(
    "conditions,succeeded,failed",
    [
        ([], False, False),
        ([{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}], True, False),
        ([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}], False, True),
        ([{"type": "Complete", "status": "False"}], False, False),
    ],
)
def test_observe_engine_job(conditions, succeeded, failed):
    observed = observe_engine_job({"metadata": {"name": "e", "uid": "u"}, "status": {"conditions": conditions}})
    assert (observed.succeeded, observed.failed) == (succeeded, failed)


def test_observe_pod_reads_when_the_container_finished():
    raw = raw_pod({"phase": "Failed", "containerStatuses": [{"name": "trainer", "state": {"terminated": {
        "exitCode": 1, "reason": "Error", "finishedAt": "2026-05-01T11:59:00Z"}}}]})
    assert observe_pod(raw).finished_at == datetime(2026, 5, 1, 11, 59, tzinfo=timezone.utc)
