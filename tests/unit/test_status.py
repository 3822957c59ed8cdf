"""The pure status and plan functions: observations in, status and actions out, table by table."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from dtrain_operator.api import DistributedTraining, DistributedTrainingStatus, Goodput, contract, immutable_spec
from dtrain_operator.core.child_plan import plan_children
from dtrain_operator.core.observation import Observed, format_time
from dtrain_operator.core.status.compute import compute_status
from dtrain_operator.core.status.events import status_events, status_patch, worth_batching
from dtrain_operator.core.status.invalid import invalid_status
from tests.builders import (
    EARLIER,
    NOW,
    a_cpu_job,
    a_gang,
    a_worker,
    accepted_status,
    an_engine_job,
    an_engine_pod,
)

MNIST = a_cpu_job().in_namespace("ml").with_nodes(3).with_uid().at_generation(1)
"""The job these tests observe: three CPU workers, no engine step."""


def condition(status: DistributedTrainingStatus, type_: str) -> tuple[str, str] | None:
    found = next((c for c in status.conditions if c.type == type_), None)
    return None if found is None else (found.status, found.reason)


def compute(job: DistributedTraining, observed: Observed = Observed(), previous=None, now=NOW):
    return compute_status(job, observed, previous, now)


# --- Phases -------------------------------------------------------------------------------------------

JOB = MNIST.as_model()

PHASE_TABLE = [
    # (case, previous status, observed workers, expected phase, expected restarts, expected nodesReady)
    ("new job", None, (), "Pending", 0, "0/3"),
    ("pods not scheduled yet", accepted_status(JOB, "Pending"), a_gang("Pending", "Pending", "Pending"),
     "Pending", 0, "0/3"),
    ("all scheduled, none running", accepted_status(JOB, "Pending"),
     tuple(replace(p, scheduled=True) for p in a_gang("Pending", "Pending", "Pending")), "Starting", 0, "0/3"),
    ("some running", accepted_status(JOB, "Starting"),
     tuple(replace(p, scheduled=True) for p in a_gang("Running", "Pending", "Running")), "Starting", 0, "2/3"),
    ("all running", accepted_status(JOB, "Starting"), a_gang("Running", "Running", "Running"), "Running", 0, "3/3"),
    ("a rank finished early", accepted_status(JOB), a_gang("Running", "Succeeded", "Running"), "Running", 0, "2/3"),
    ("a worker failed", accepted_status(JOB), a_gang("Running", "Failed", "Running"), "Restarting", 1, "0/3"),
    ("a worker vanished", accepted_status(JOB), a_gang("Running", "Running"), "Restarting", 1, "0/3"),
    ("a pod not created yet before the gang ran", accepted_status(JOB, "Pending"), a_gang("Pending", "Pending"),
     "Pending", 0, "0/3"),
    ("the new gang starting, the old one ignored", accepted_status(JOB, "Restarting", restarts=1),
     a_gang("Failed", "Running", "Running") + a_gang("Pending", "Running", "Running", generation=1),
     "Restarting", 1, "2/3"),
    ("the new gang running", accepted_status(JOB, "Restarting", restarts=1),
     a_gang("Running", "Running", "Running", generation=1), "Running", 1, "3/3"),
    ("backoff limit reached", accepted_status(JOB, restarts=3), a_gang("Failed", "Running", "Running", generation=3),
     "Failed", 3, "2/3"),
    ("rank 0 exited 0", accepted_status(JOB), a_gang("Succeeded", "Running", "Running"), "Succeeded", 0, "2/3"),
]


@pytest.mark.parametrize("case,previous,workers,phase,restarts,ready", PHASE_TABLE, ids=[row[0] for row in PHASE_TABLE])
def test_phase_table(case, previous, workers, phase, restarts, ready):
    status = compute(JOB, Observed(workers=workers), previous)
    assert (status.phase, status.restarts, status.nodes_ready) == (phase, restarts, ready)


def test_a_new_job_records_what_it_accepted():
    status = compute(JOB)
    assert status.accepted_spec == immutable_spec(JOB.spec)
    assert (status.start_time, status.observed_generation) == (format_time(NOW), 1)
    assert condition(status, "Created") == ("True", "JobCreated")
    assert status.nodes.model_dump() == {"total": 3, "pending": 3, "running": 0, "succeeded": 0, "failed": 0}


def test_a_restart_carries_the_decision():
    status = compute(JOB, Observed(workers=a_gang("Running", "Failed", "Running")), accepted_status(JOB))
    assert condition(status, "Restarting") == ("True", "WorkerFailed")
    assert condition(status, "Running") == ("False", "GangRestarting")
    again = compute(JOB, Observed(workers=a_gang("Running", "Running", "Running", generation=1)), status)
    assert condition(again, "Restarting") == ("False", "GangRunning")
    assert condition(again, "Running") == ("True", "AllWorkersRunning")


@pytest.mark.parametrize(
    "policy,exit_code,lost,phase,reason",
    [
        ("ExitCode", 1, False, "Failed", "NonRetryableExitCode"),
        ("ExitCode", 137, False, "Restarting", "WorkerFailed"),
        ("ExitCode", None, True, "Restarting", "WorkerFailed"),
        ("Never", 137, False, "Failed", "RestartPolicyNever"),
        ("OnFailure", 1, False, "Restarting", "WorkerFailed"),
    ],
)
def test_restart_policies(policy, exit_code, lost, phase, reason):
    job = MNIST.with_restart_policy(policy).as_model()
    failed = a_worker(1, "Failed", exit_code=exit_code, lost=lost, reason="Evicted" if lost else "Error")
    status = compute(job, Observed(workers=(a_worker(0), failed, a_worker(2))), accepted_status(job))
    assert status.phase == phase
    assert condition(status, "Failed" if phase == "Failed" else "Restarting")[1] == reason


def test_the_first_failure_decides_and_its_peers_consequences_do_not():
    job = MNIST.with_restart_policy("ExitCode").as_model()
    killed = a_worker(1, "Failed", exit_code=137, reason="OOMKilled", finished_at=EARLIER)
    broken_pipe = a_worker(0, "Failed", exit_code=1, finished_at=EARLIER + timedelta(seconds=20))
    status = compute(job, Observed(workers=(broken_pipe, killed, a_worker(2))), accepted_status(job))
    assert (status.phase, status.restarts) == ("Restarting", 1)


def test_training_success_copies_the_trainer_results():
    """Only the fields TrainerResults knows: status.artifacts has a fixed schema, whatever the job's code wrote."""
    results = {"onnx": "/workspace/artifacts/model.onnx", "parityError": 1e-6}
    written = {**results, "pwned": "x" * 1000, "engine": "https://evil.example/model.plan"}
    done = a_worker(0, "Succeeded", exit_code=0, message=json.dumps(written))
    status = compute(JOB, Observed(workers=(done, a_worker(1), a_worker(2))), accepted_status(JOB))
    assert status.phase == "Succeeded"
    assert status.artifacts == results
    assert condition(status, "TrainingSucceeded") == ("True", "TrainerSucceeded")
    assert status.completion_time == format_time(NOW)


ENGINE_JOB = MNIST.with_engine().as_model()
TRAINED = accepted_status(ENGINE_JOB, "BuildingEngine", conditions=[{"type": "TrainingSucceeded", "status": "True"}],
                          artifacts={"onnx": "model.onnx"})


@pytest.mark.parametrize(
    "case,observed,now,phase,artifacts,message",
    [
        ("no engine Job yet", Observed(), NOW, "BuildingEngine", {"onnx": "model.onnx"}, None),
        ("engine Job running", Observed(engine_job=an_engine_job()), NOW, "BuildingEngine", {"onnx": "model.onnx"},
         None),
        ("engine built", Observed(engine_job=an_engine_job(succeeded=True),
                                  engine_pods=(an_engine_pod("Succeeded", '{"kind": "engine", "engine": "model.plan"}'),)),
         NOW, "Succeeded", {"onnx": "model.onnx", "kind": "engine", "engine": "model.plan"}, None),
        ("Job seen done before its pod", Observed(engine_job=an_engine_job(succeeded=True)), NOW + timedelta(seconds=5),
         "BuildingEngine", {"onnx": "model.onnx"}, None),
        ("the pod never seen", Observed(engine_job=an_engine_job(succeeded=True)), NOW + timedelta(minutes=5),
         "Succeeded", {"onnx": "model.onnx"}, None),
        ("engine build failed", Observed(engine_job=an_engine_job(failed=True),
                                         engine_pods=(an_engine_pod("Failed", "TensorRT: unsupported op"),)),
         NOW, "Failed", {"onnx": "model.onnx"}, "Job mnist-engine failed: TensorRT: unsupported op"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_engine_table(case, observed, now, phase, artifacts, message):
    status = compute(ENGINE_JOB, observed, TRAINED, now)
    assert (status.phase, status.artifacts) == (phase, artifacts)
    if message:
        failed = next(c for c in status.conditions if c.type == "Failed")
        assert (failed.reason, failed.message) == ("EngineBuildFailed", message)


def test_suspend_and_resume():
    suspended_job = MNIST.suspended().as_model()
    status = compute(suspended_job, Observed(workers=a_gang("Running", "Running", "Running")), accepted_status(JOB))
    assert (status.phase, condition(status, "Suspended")) == ("Suspended", ("True", "JobSuspended"))
    resumed = compute(JOB, Observed(), status, NOW + timedelta(hours=1))
    assert resumed.phase == "Pending"
    assert condition(resumed, "Suspended") == ("False", "JobResumed")
    assert resumed.start_time == format_time(NOW + timedelta(hours=1))  # the deadline counts from the resume
    assert resumed.restarts == 0


def test_deadline():
    job = MNIST.with_deadline(600).as_model()
    running = Observed(workers=a_gang("Running", "Running", "Running"))
    inside = compute(job, running, accepted_status(job), EARLIER + timedelta(seconds=599))
    assert inside.phase == "Running"
    past = compute(job, running, accepted_status(job), EARLIER + timedelta(seconds=601))
    assert (past.phase, condition(past, "Failed")) == ("Failed", ("True", "DeadlineExceeded"))


def test_finished_jobs_keep_their_status():
    done = compute(JOB, Observed(workers=a_gang("Succeeded", "Succeeded", "Succeeded")), accepted_status(JOB))
    later = compute(JOB, Observed(), done, NOW + timedelta(hours=1))
    assert later == done


def test_pods_pending_too_long_are_named_with_their_reasons():
    job = MNIST.with_schedule_timeout(60).as_model()
    stuck = a_worker(1, "Pending", pending_reason="Unschedulable: 0/4 nodes are available")
    fresh = a_worker(2, "Pending", created_at=NOW - timedelta(seconds=10), pending_reason="ContainerCreating")
    status = compute(job, Observed(workers=(a_worker(0), stuck, fresh)), accepted_status(job, "Starting"))
    found = next(c for c in status.conditions if c.type == "PodsPending")
    assert (found.status, found.reason) == ("True", "PodsPendingTooLong")
    assert found.message == "Pending for more than 60 s: mnist-1: Unschedulable: 0/4 nodes are available"
    plan = plan_children(job, status, Observed(workers=(a_worker(0), stuck, fresh)), NOW)
    assert plan.requeue_after == pytest.approx(50.1)


def test_an_immutable_change_is_reported_and_the_accepted_spec_runs():
    previous = accepted_status(JOB)
    changed = MNIST.at_generation(2).with_nodes(4).with_spec(trainer={"batchSize": 64}).as_model()
    status = compute(changed, Observed(workers=a_gang("Running", "Running", "Running")), previous)
    found = next(c for c in status.conditions if c.type == "SpecImmutable")
    assert (found.status, found.reason) == ("True", "ImmutableFieldChanged")
    assert found.message.startswith("spec.nodes, spec.trainer.batchSize cannot change")
    assert (status.phase, status.nodes_ready, status.observed_generation) == ("Running", "3/3", 2)
    reverted = compute(MNIST.at_generation(3).as_model(), Observed(workers=a_gang("Running", "Running", "Running")),
                       status)
    assert condition(reverted, "SpecImmutable") == ("False", "SpecUnchanged")


def test_scheduling_may_change_while_suspended():
    suspended = compute(MNIST.suspended().as_model(), Observed(), accepted_status(JOB))
    moved = MNIST.at_generation(2).suspended().with_spec(scheduling={"nodeSelector": {"pool": "h100"}}).as_model()
    status = compute(moved, Observed(), suspended)
    assert condition(status, "SpecImmutable") is None
    assert status.accepted_spec["scheduling"]["nodeSelector"] == {"pool": "h100"}
    # Kueue injects the node selector and unsuspends in one update: still accepted.
    admitted = compute(MNIST.at_generation(3).with_spec(scheduling={"nodeSelector": {"pool": "a100"}}).as_model(),
                       Observed(), status)
    assert (admitted.phase, condition(admitted, "SpecImmutable")) == ("Pending", None)
    assert admitted.accepted_spec["scheduling"]["nodeSelector"] == {"pool": "a100"}
    moved_again = compute(MNIST.at_generation(4).with_spec(scheduling={"nodeSelector": {"pool": "v100"}}).as_model(),
                          Observed(), admitted)
    assert condition(moved_again, "SpecImmutable") == ("True", "ImmutableFieldChanged")


def test_a_mutable_change_is_not_reported():
    status = compute(MNIST.with_ttl(60).as_model(), Observed(workers=a_gang(*["Running"] * 3)), accepted_status(JOB))
    assert condition(status, "SpecImmutable") is None


def test_an_invalid_edit_is_reported():
    status = compute_status(JOB, Observed(workers=a_gang(*["Running"] * 3)), accepted_status(JOB), NOW,
                            spec_errors=["spec.nodes: Input should be greater than or equal to 1"])
    assert condition(status, "SpecImmutable") == ("True", "InvalidSpecChange")
    assert status.phase == "Running"


def test_exporting_follows_the_trainers_stage():
    progress = {"epoch": 2, "stage": contract.PROGRESS_STAGE_EXPORTING, "updatedAt": format_time(NOW)}
    previous = accepted_status(JOB, progress=progress)
    status = compute(JOB, Observed(workers=a_gang("Running", "Succeeded", "Succeeded")), previous)
    assert status.phase == "Exporting"
    assert status.progress.model_dump(by_alias=True, exclude_none=True) == progress


@pytest.mark.parametrize(
    "updated_at", [None, format_time(EARLIER - timedelta(minutes=1)), format_time(EARLIER)], ids=["untimed", "before", "same-second"]
)
def test_a_stage_reported_before_the_gang_was_created_is_not_its_stage(updated_at):
    progress = {"stage": contract.PROGRESS_STAGE_EXPORTING, **({"updatedAt": updated_at} if updated_at else {})}
    status = compute(JOB, Observed(workers=a_gang("Running", "Running", "Running")),
                     accepted_status(JOB, progress=progress))
    assert status.phase == "Running"


def test_invalid_objects_fail_and_start_once_fixed():
    failed = invalid_status(None, ["spec.nodes: Input should be greater than or equal to 1"], 1, NOW)
    assert (failed.phase, condition(failed, "Failed")) == ("Failed", ("True", "InvalidSpec"))
    assert "spec.nodes: Input should be greater than or equal to 1" in failed.conditions[0].message
    assert failed.accepted_spec is None
    started = compute(JOB, Observed(), failed)
    assert (started.phase, condition(started, "Failed")) == ("Pending", None)


def test_condition_times_move_only_when_the_status_flips():
    first = compute(JOB, Observed(workers=a_gang(*["Running"] * 3)), accepted_status(JOB, "Starting"))
    later = compute(JOB, Observed(workers=a_gang(*["Running"] * 3)), first, NOW + timedelta(minutes=5))
    assert later.conditions == first.conditions


# --- What is written and said ---------------------------------------------------------------------------


def test_status_patch_holds_only_what_changed_and_never_the_trainers_fields():
    previous = accepted_status(JOB, "Starting", progress={"epoch": 1}, lastCheckpoint={"step": 10}, nodesReady="2/3",
                               nodes={"total": 3, "pending": 1, "running": 2})
    new = compute(JOB, Observed(workers=a_gang(*["Running"] * 3)), previous)
    patch = status_patch(previous, new)
    # The goodput too: the operator counts it at every reconcile, and writes it with the other changes.
    assert set(patch) == {"phase", "conditions", "nodes", "nodesReady", "observedGeneration", "goodput"}
    assert status_patch(new, new) is None


def test_a_patch_of_counts_and_quiet_phases_alone_can_wait():
    before = accepted_status(JOB, "Starting", nodesReady="1/3")
    after = before.model_copy(update={"nodes_ready": "2/3"})
    assert worth_batching(status_patch(before, after))
    assert worth_batching(status_patch(before, after.model_copy(update={"goodput": Goodput(ratio=0.5)})))
    # Pending -> Starting posts no Event and decides nothing: the Running that follows within a second carries it.
    assert worth_batching(status_patch(accepted_status(JOB, "Pending"), before))
    assert not worth_batching(status_patch(before, after.model_copy(update={"phase": "Running"})))
    assert not worth_batching(status_patch(before, after.model_copy(update={"phase": "Restarting"})))


def test_removed_keys_are_nulled_in_the_merge_patch_at_any_depth():
    before = accepted_status(JOB, artifacts={"onnx": "a", "engine": "b"})
    after = before.model_copy(update={"artifacts": {"onnx": "a"}})
    assert status_patch(before, after) == {"artifacts": {"engine": None}}
    counting = before.model_copy(update={"goodput": Goodput(current="engine", seconds={"starting": 2.0, "engine": 1.0})})
    done = before.model_copy(update={"goodput": Goodput(seconds={"starting": 2.0, "engine": 3.0})})
    assert status_patch(counting, done) == {"goodput": {"current": None, "seconds": {"engine": 3.0}}}


@pytest.mark.parametrize(
    "before,after,events",
    [
        (None, "Pending", []),  # the first steps of a start have no Event: the phase shows them
        ("Pending", "Starting", []),
        ("Starting", "Running", [("Normal", "Running")]),
        ("Restarting", "Pending", []),
        ("Running", "Restarting", [("Warning", "Restarting")]),
        ("Running", "Failed", [("Warning", "Failed")]),
        ("Running", "Running", []),
    ],
)
def test_an_event_for_each_phase_change_but_the_first_steps_of_a_start(before, after, events):
    previous = accepted_status(JOB, before) if before else None
    new = accepted_status(JOB, after)
    assert [(e.type, e.reason) for e in status_events(previous, new)] == events


def test_warnings_for_conditions_that_need_the_user():
    previous = accepted_status(JOB)
    new = accepted_status(JOB, conditions=[{"type": "PodsPending", "status": "True", "reason": "PodsPendingTooLong",
                                            "message": "mnist-1: Unschedulable"}])
    (event,) = status_events(previous, new)
    assert (event.type, event.reason, event.message) == ("Warning", "PodsPending", "mnist-1: Unschedulable")
    assert status_events(new, new) == []


# --- The plan -------------------------------------------------------------------------------------------


def plan_for(job: DistributedTraining, phase: str, workers=(), restarts: int = 0, now=NOW, **fields: Any):
    status = accepted_status(job, phase, restarts=restarts, **fields)
    return plan_children(job, status, Observed(workers=tuple(workers)), now)


def names(pods) -> list[str]:
    return sorted(f"{p.name}@{p.generation}" for p in pods)


def test_plan_creates_missing_pods_while_starting():
    plan = plan_for(JOB, "Pending", [a_worker(1, "Pending")])
    assert (plan.create_ranks, plan.delete_pods) == ((0, 2), ())


def test_plan_replaces_the_old_gang_waiting_for_names_to_free():
    old = [a_worker(0, "Running"), a_worker(1, "Failed"), a_worker(2, "Running", deleting=True)]
    plan = plan_for(JOB, "Restarting", old, restarts=1)
    assert names(plan.delete_pods) == ["mnist-0@0", "mnist-1@0"]
    assert plan.create_ranks == ()
    plan = plan_for(JOB, "Restarting", [a_worker(2, "Running", generation=1)], restarts=1)
    assert plan.create_ranks == (0, 1)


def test_plan_creates_nothing_once_running():
    assert plan_for(JOB, "Running", a_gang("Running", "Running")).create_ranks == ()


def test_plan_suspended_deletes_every_worker():
    assert names(plan_for(JOB, "Suspended", a_gang("Running", "Pending")).delete_pods) == ["mnist-0@0", "mnist-1@0"]


def test_plan_builds_the_engine_once():
    assert plan_children(ENGINE_JOB, TRAINED, Observed(), NOW).create_engine_job
    assert not plan_children(ENGINE_JOB, TRAINED, Observed(engine_job=an_engine_job()), NOW).create_engine_job


@pytest.mark.parametrize(
    "policy,deleted,engine_deleted",
    [("All", ["mnist-0@0", "mnist-1@0", "mnist-2@0"], True), ("Running", ["mnist-0@0"], True), ("None", [], False)],
)
def test_plan_cleans_up_finished_jobs(policy, deleted, engine_deleted):
    job = MNIST.with_engine().with_clean_pod_policy(policy).as_model()
    status = accepted_status(job, "Failed", completionTime=format_time(NOW))
    observed = Observed(workers=a_gang("Running", "Failed", "Succeeded"), engine_job=an_engine_job())
    plan = plan_children(job, status, observed, NOW)
    assert names(plan.delete_pods) == deleted
    assert (plan.delete_engine_job is not None) == engine_deleted


def test_plan_deletes_the_job_after_its_ttl():
    job = MNIST.with_ttl(30).as_model()
    status = accepted_status(job, "Succeeded", completionTime=format_time(NOW))
    waiting = plan_children(job, status, Observed(), NOW + timedelta(seconds=10))
    assert (waiting.delete_job, waiting.requeue_after) == (False, pytest.approx(20.1))
    assert plan_children(job, status, Observed(), NOW + timedelta(seconds=30)).delete_job


def test_plan_requeues_at_the_deadline():
    job = MNIST.with_deadline(900).as_model()
    plan = plan_for(job, "Running", a_gang("Running", "Running", "Running"))
    assert plan.requeue_after == pytest.approx(300.1)
