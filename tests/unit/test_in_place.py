"""A gang restarted in place (core.in_place), through the pure status and plan functions: a supervisor's report
of torchrun's exit in, the restart decided in place, the old pods kept and told to stop, relabelled only once
every supervisor has stopped, then told to run; or recreated when in place cannot be (or cannot finish)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from dtrain_operator.api import launches
from dtrain_operator.api.launches import REASON_STOPPED, LaunchReport
from dtrain_operator.core import in_place, progress_deadline
from dtrain_operator.core.child_plan import plan_children
from dtrain_operator.core.observation import Observed, PodObservation, SupervisorState
from dtrain_operator.core.status.compute import compute_status
from dtrain_operator.core.status.events import status_events, status_patch
from tests.builders import NOW, a_cpu_job, a_worker, accepted_status, read_back

JOB_BUILDER = a_cpu_job().with_nodes(2).with_uid().with_progress_deadline(60)
JOB = JOB_BUILDER.as_model()


def supervised(pod: PodObservation, state: str = "running", generation: int | None = None, seconds_ago: float = 1,
               **report) -> PodObservation:
    """`pod` with its supervisor's latest report, received `seconds_ago`."""
    report = LaunchReport(generation=pod.generation if generation is None else generation, state=state, **report)
    return replace(pod, supervisor=SupervisorState(report, NOW - timedelta(seconds=seconds_ago)))


def gang(generation: int = 0, **reports) -> tuple[PodObservation, ...]:
    """Both workers Running in `generation`, each with a supervisor reporting torchrun running (or `reports[rank]`)."""
    return tuple(
        reports.get(f"rank{rank}") or supervised(a_worker(rank, generation=generation)) for rank in range(2)
    )


def killed_rank_1(generation: int = 0) -> tuple[PodObservation, ...]:
    return gang(generation, rank1=supervised(a_worker(1, generation=generation), "exited", exit_code=137,
                                             reason="Error", message="worker 1 was killed"))


def decide(workers, previous, job=JOB, now=NOW):
    status = compute_status(job, Observed(workers=workers), previous, now)
    return status, plan_children(job.model_copy(update={"status": status}), status, Observed(workers=workers), now)


def test_a_process_exit_in_a_live_pod_restarts_the_gang_in_place():
    status, plan = decide(killed_rank_1(), accepted_status(JOB))
    assert (status.phase, status.restarts, status.restarts_in_place, status.gang_generation) == ("Restarting", 1, 1, 1)
    assert status.in_place_generation == 1
    assert status.last_restart.strategy == "InPlace" and "every worker pod and its node are still there" in status.last_restart.why
    restarting = next(c for c in status.conditions if c.type == "Restarting")
    assert "worker 1 exited with code 137" in restarting.message and "in place, in the same pods" in restarting.message
    # Nothing deleted, nothing created: the pods are kept, and not relabelled while torchrun runs in them.
    assert (plan.delete_pods, plan.create_ranks, plan.relabel_pods) == ((), (), ())
    patch = status_patch(accepted_status(JOB), status)
    assert patch["restartsInPlace"] == 1 and patch["inPlaceGeneration"] == 1
    assert patch["lastRestart"]["strategy"] == "InPlace"
    # One Event says the restart and how it is made: the Restarting condition's message.
    events = [(e.type, e.reason, e.message) for e in status_events(accepted_status(JOB), status)]
    assert events == [("Warning", "Restarting", restarting.message)]


def test_the_supervisors_are_told_to_stop_then_to_run_once_every_one_has_stopped():
    status, _ = decide(killed_rank_1(), accepted_status(JOB))
    job = JOB.model_copy(update={"status": status})
    running, exited = killed_rank_1()
    # Rank 0 still runs torchrun of generation 0: stop, with the survivors' grace (the progress deadline).
    order = in_place.order(job, status, running)
    assert (order.action, order.generation, order.grace_seconds) == ("stop", 0, 60)
    assert in_place.order(job, status, exited).action == "wait"
    # Rank 0 stopped: the barrier is passed, both pods take generation 1.
    stopped = supervised(a_worker(0), "exited", exit_code=143, reason=REASON_STOPPED)
    again, plan = decide((stopped, exited), status)
    assert again.phase == "Restarting" and {p.rank for p in plan.relabel_pods} == {0, 1}
    assert in_place.relabel_patch(1, "uid-0-0") == {
        "metadata": {"uid": "uid-0-0", "labels": {"dtrain.dev/gang-generation": "1"}}
    }
    # Relabelled (the watch shows the new label): the same pods are gang 1, told to run it.
    relabelled = tuple(replace(p, generation=1) for p in (stopped, exited))
    running_again, plan = decide(relabelled, again)
    assert running_again.phase == "Running" and running_again.restarts == 1
    assert (plan.delete_pods, plan.create_ranks) == ((), ())
    assert {in_place.order(job, running_again, p).action for p in relabelled} == {"run"}
    assert {in_place.order(job, running_again, p).generation for p in relabelled} == {1}


def test_the_old_launch_failing_again_is_not_a_second_restart():
    """The survivor's own exit (its peer gone) comes after the decision: it is the old launch's, counted once."""
    status, _ = decide(killed_rank_1(), accepted_status(JOB))
    both_exited = (supervised(a_worker(0), "exited", exit_code=1), killed_rank_1()[1])
    again, _ = decide(both_exited, status)
    assert (again.restarts, again.in_place_generation) == (1, 1)


def test_an_exit_reported_while_the_gang_runs_again_is_a_new_failure():
    status, _ = decide(killed_rank_1(), accepted_status(JOB))
    relabelled = gang(1)
    running = decide(relabelled, status)[0]
    failed_again = decide(killed_rank_1(generation=1), running)[0]
    assert (failed_again.restarts, failed_again.restarts_in_place, failed_again.in_place_generation) == (2, 2, 2)


@pytest.mark.parametrize(
    "workers,job,why",
    [
        (gang(rank1=a_worker(1, "Failed", exit_code=137, reason="Error")), JOB, "pod is gone or failed"),
        (gang(rank1=supervised(a_worker(1), "exited", exit_code=137, reason="OOMKilled")), JOB, "a new pod is the cure"),
        (killed_rank_1(), JOB_BUILDER.with_restart_strategy("Recreate").as_model(), "runPolicy.restartStrategy is Recreate"),
        (killed_rank_1()[1:] + (supervised(a_worker(0), seconds_ago=120),), JOB, "has not reported for over"),
        (killed_rank_1(), JOB_BUILDER.with_failure_rules(
            {"action": "RestartGang", "onExitCodes": [137], "restartStrategy": "Recreate"}).as_model(),
         "failureRules[0] says restartStrategy Recreate"),
    ],
    ids=["pod failed", "OOM kill", "strategy Recreate", "cut off supervisor", "rule says Recreate"],
)
def test_a_restart_that_cannot_be_made_in_place_recreates_the_pods(workers, job, why):
    status, plan = decide(workers, accepted_status(job), job)
    assert status.phase == "Restarting" and status.restarts_in_place == 0 and status.in_place_generation is None
    assert status.last_restart.strategy == "Recreate" and why in status.last_restart.why
    assert {p.rank for p in plan.delete_pods if p.phase != "Failed"} == {p.rank for p in workers if p.phase != "Failed"}


def test_a_hang_restarts_in_place_when_every_supervisor_is_heard():
    status = accepted_status(JOB, progress={"step": 3, "batches": 9, "gangGeneration": 0})
    watch = progress_deadline.ProgressWatch(0, ("batches", 9, None), NOW - timedelta(seconds=61), 3, "training", True)
    hung = compute_status(JOB, Observed(workers=gang()), status, NOW, progress_watch=watch)
    assert (hung.restarts, hung.in_place_generation) == (1, 1)
    assert in_place.order(JOB, hung, gang()[0]).grace_seconds == 5  # a hung gang's SIGTERM handler cannot run


def test_an_in_place_restart_that_cannot_finish_recreates_the_pods_without_counting_twice():
    status, _ = decide(killed_rank_1(), accepted_status(JOB))
    # Rank 0's pod failed before the barrier (its supervisor exited): recreate.
    gone = (replace(killed_rank_1()[0], phase="Failed", exit_code=143), killed_rank_1()[1])
    fallen, plan = decide(gone, status)
    assert (fallen.restarts, fallen.restarts_in_place, fallen.in_place_generation) == (1, 0, None)
    assert fallen.last_restart.strategy == "Recreate" and "could not finish" in fallen.last_restart.why
    assert {p.rank for p in plan.delete_pods} == {0, 1}
    assert "then pod mnist-0 is Failed" in next(c for c in fallen.conditions if c.type == "Restarting").message
    assert "RestartByRecreate" in {e.reason for e in status_events(status, fallen)}
    # Rank 0 never stops within the grace period and the margin: recreate.
    late = NOW + timedelta(seconds=60 + in_place.START_MARGIN_SECONDS + 1)
    heard = tuple(replace(p, supervisor=replace(p.supervisor, received_at=late)) for p in killed_rank_1())
    timed_out, plan = decide(heard, status, now=late)
    assert timed_out.in_place_generation is None and "did not stop within" in timed_out.last_restart.why
    assert {p.rank for p in plan.delete_pods} == {0, 1}
    # A supervisor no longer heard from (its pod's link cut) cannot be told to start: recreate, at once.
    cut = (heard[0], replace(heard[1], supervisor=replace(heard[1].supervisor, received_at=NOW - timedelta(minutes=1))))
    cut_off, _ = decide(cut, status, now=NOW + timedelta(seconds=10))
    assert "mnist-1's supervisor has not reported for over 25 s" in cut_off.last_restart.why
    # Before then, the plan asks to look again when it would give up: when a supervisor last heard 1 s before
    # the decision would go unheard (a pod cut off sends nothing that would wake the operator)...
    _, waiting = decide(killed_rank_1(), status, now=NOW + timedelta(seconds=10))
    assert waiting.requeue_after == pytest.approx(launches.REPORT_FRESH_SECONDS - 11 + 0.5)
    # ... or, while every supervisor keeps reporting, when the stop's grace period and margin run out.
    later = NOW + timedelta(seconds=70)
    fresh = tuple(replace(p, supervisor=replace(p.supervisor, received_at=later)) for p in killed_rank_1())
    _, waiting = decide(fresh, status, now=later)
    assert waiting.requeue_after == pytest.approx(60 + in_place.START_MARGIN_SECONDS - 70 + 0.5)


def test_orders_for_a_finished_job_and_an_older_generation_are_to_exit():
    finished = accepted_status(JOB, "Failed", restarts=1)
    assert in_place.order(JOB, finished, gang(1)[0]).action == "exit"
    recreating = accepted_status(JOB, "Restarting", restarts=1)
    assert in_place.order(JOB, recreating, gang(0)[0]).action == "exit"


def test_the_status_keeps_what_decides_the_pods():
    status, _ = decide(killed_rank_1(), accepted_status(JOB))
    previous = read_back(status)
    assert (previous.restarts_in_place, previous.in_place_generation) == (1, 1)


@pytest.mark.parametrize("reason", ["WorkloadEvicted", "WorkloadEvictedDueToPreempted", "Deleted", "Evicted", "NodeLost"])
def test_a_supervisor_cannot_report_a_reason_only_the_operator_observes(reason):
    """A worker's code runs in its pod: a report naming an eviction or a lost pod would buy a restart that counts
    against nothing. Such a report is refused; the reasons a supervisor can know are its own."""
    with pytest.raises(ValueError, match="reason"):
        LaunchReport.model_validate({"generation": 0, "state": "exited", "exitCode": 1, "reason": reason})
    for own in ("Error", "OOMKilled", REASON_STOPPED):
        assert LaunchReport.model_validate({"generation": 0, "state": "exited", "exitCode": 1, "reason": own}).reason == own


def test_the_survivors_of_a_worker_whose_pod_vanished_go_with_the_hung_gangs_grace():
    """A lost node's pod, deleted by the pod GC or by hand: its processes closed no connection, so rank 0 waits in
    a collective that never returns; it goes with the hung gang's grace, not the progress deadline (600 s by
    default), and the new gang is not held back for it."""
    job = JOB_BUILDER.with_restart_strategy("Recreate").as_model()
    status, plan = decide((supervised(a_worker(0)),), accepted_status(job))
    assert (status.phase, status.gang_generation) == ("Restarting", 1)
    assert [p.name for p in plan.delete_pods] == ["mnist-0"]
    assert plan.delete_grace_seconds == progress_deadline.HUNG_GANG_GRACE_SECONDS
    # Its pod still listed, force-deleted (the API server keeps it until its kubelet or the pod GC confirms).
    forced = replace(a_worker(1), deleting=True, force_deleted=True)
    _, plan = decide((supervised(a_worker(0)), forced), accepted_status(job))
    assert plan.delete_grace_seconds == progress_deadline.HUNG_GANG_GRACE_SECONDS

    # Rank 0 says it writes a checkpoint (its collective failed: the peer's connection closed): it gets the time.
    writing = accepted_status(job, progress={"stage": "checkpointing", "step": 24, "gangGeneration": 0})
    _, plan = decide((supervised(a_worker(0)),), writing)
    assert plan.delete_grace_seconds == 60


def test_the_survivors_of_a_worker_that_failed_in_its_pod_get_the_progress_deadline():
    """The peer's pod is still there (its process exited, its connections closed): a survivor may be writing its
    checkpoint, and gets the progress deadline to finish it."""
    job = JOB_BUILDER.with_restart_strategy("Recreate").as_model()
    status, plan = decide(killed_rank_1(), accepted_status(job))
    assert status.last_restart.strategy == "Recreate" and {p.name for p in plan.delete_pods} == {"mnist-0", "mnist-1"}
    assert plan.delete_grace_seconds == 60
