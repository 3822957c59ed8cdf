"""The operator's elastic gang (spec.elastic), table by table: observed pods and the previous status in, the new
status, its Events and the children to create and delete out."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from dtrain_operator.api import CheckpointInfo, DistributedTrainingStatus, contract
from dtrain_operator.core import render
from dtrain_operator.core.child_plan import plan_children
from dtrain_operator.core.observation import Observed, PodObservation
from dtrain_operator.core.standby import STANDBY_COMMAND, render_standby_pod
from dtrain_operator.core.status.compute import compute_status
from dtrain_operator.core.status.events import EVENT_GANG_GROWN, EVENT_GANG_SHRUNK, status_events
from tests.builders import NOW, a_cpu_job, a_gang, a_worker, accepted_status, read_back

WAIT = 60
JOB = (
    a_cpu_job().with_nodes(3).with_uid().with_backoff_limit(0)
    .with_spec(elastic={"minNodes": 2, "waitSeconds": WAIT}, trainer={"batchSize": 8}).as_model()
)


def unplaced(rank: int, generation: int = 0, waited: float = WAIT + 1) -> PodObservation:
    return a_worker(rank, "Pending", generation, created_at=NOW - timedelta(seconds=waited),
                    pending_reason="Unschedulable: 0/2 nodes are available")


def standby(rank: int, placed: bool = True) -> PodObservation:
    return replace(a_worker(rank, "Running" if placed else "Pending"), name=f"mnist-standby-{rank}",
                   uid=f"standby-{rank}", role=contract.ROLE_STANDBY)


def condition(status: DistributedTrainingStatus, type_: str) -> tuple[str, str] | None:
    found = next((c for c in status.conditions if c.type == type_), None)
    return None if found is None else (found.status, found.reason)


def shrunk() -> DistributedTrainingStatus:
    """The gang restarted on 2 of its 3 nodes: rank 2 could not be placed again."""
    previous = accepted_status(JOB, "Restarting", restartsIgnoringBackoff=1)
    observed = Observed(workers=(a_worker(0, generation=1), a_worker(1, generation=1), unplaced(2, generation=1)))
    return compute_status(JOB, observed, previous, NOW)


def test_a_pod_unplaced_past_wait_seconds_shrinks_the_gang_without_counting_a_restart() -> None:
    status = shrunk()
    assert (status.phase, status.restarts, status.restarts_ignoring_backoff, status.gang_generation) == (
        "Restarting", 0, 2, 2
    )
    assert status.elastic is not None
    assert (status.elastic.nodes, status.elastic.wanted_nodes, status.elastic.min_nodes, status.elastic.resizes) == (
        2, 3, 2, 1
    )
    assert status.nodes_ready == "0/2 of 3"
    assert condition(status, "Restarting") == ("True", "NodesLost")
    assert status.elastic.last_resize == (
        "mnist-2 could not be placed for 60 s (Unschedulable: 0/2 nodes are available): training goes on from the "
        "last checkpoint on 2 of 3 nodes; batchSize 6 per process and accumulateGradBatches 2 keep the global batch "
        "of 24"
    )
    assert [(e.type, e.reason) for e in status_events(accepted_status(JOB, "Restarting"), status)][-1] == (
        "Warning", EVENT_GANG_SHRUNK
    )
    # The new gang: two pods whose torchrun names 2 nodes, a standby pod for rank 2; the old gang goes.
    old = (a_worker(0, generation=1), a_worker(1, generation=1), unplaced(2, generation=1))
    assert {p.name for p in plan_children(JOB, status, Observed(workers=old), NOW).delete_pods} == {
        "mnist-0", "mnist-1", "mnist-2"
    }
    plan = plan_children(JOB, status, Observed(), NOW)
    assert (plan.create_ranks, plan.gang_nodes, plan.create_standby_ranks) == ((0, 1), 2, ())
    # The standby pod asks only for what the gang leaves: once each of the gang's pods is placed.
    waiting = Observed(workers=(a_worker(0, "Pending", 2, scheduled=True), a_worker(1, "Pending", 2)))
    assert plan_children(JOB, status, waiting, NOW).create_standby_ranks == ()
    placed = Observed(workers=(a_worker(0, "Pending", 2, scheduled=True), a_worker(1, "Pending", 2, scheduled=True)))
    assert plan_children(JOB, status, placed, NOW).create_standby_ranks == (2,)
    env = {v["name"]: v.get("value") for v in render.render_worker_pod(JOB, 0, 2, None, plan.gang_nodes)["spec"]
           ["containers"][0]["env"]}
    assert env[contract.ENV_NNODES] == "2"


def test_a_pod_pending_for_less_than_wait_seconds_is_waited_for() -> None:
    previous = accepted_status(JOB, "Restarting", restartsIgnoringBackoff=1)
    observed = Observed(workers=(a_worker(0, generation=1), a_worker(1, generation=1), unplaced(2, 1, waited=20)))
    status = compute_status(JOB, observed, previous, NOW)
    assert status.elastic is not None and (status.elastic.nodes, status.elastic.resizes) == (3, 0)
    plan = plan_children(JOB, status, observed, NOW)
    assert plan.requeue_after is not None and 40 <= plan.requeue_after <= 41


def test_no_gang_smaller_than_min_nodes() -> None:
    previous = accepted_status(JOB, "Restarting", restartsIgnoringBackoff=1)
    observed = Observed(workers=(a_worker(0, generation=1), unplaced(1, generation=1), unplaced(2, generation=1)))
    status = compute_status(JOB, observed, previous, NOW)
    assert status.elastic is not None and (status.phase, status.elastic.nodes) == ("Restarting", 3)


def test_a_pod_gone_with_its_node_restarts_an_elastic_gang_without_counting_it() -> None:
    status = compute_status(JOB, Observed(workers=a_gang("Running", "Running")), accepted_status(JOB), NOW)
    assert (status.phase, status.restarts, status.restarts_ignoring_backoff) == ("Restarting", 0, 1)
    assert condition(status, "Restarting") == ("True", "NodeLost")
    fixed = a_cpu_job().with_nodes(3).with_uid().with_backoff_limit(0).as_model()
    assert compute_status(fixed, Observed(workers=a_gang("Running", "Running")), accepted_status(fixed), NOW).phase == (
        "Failed"
    )


def test_a_smaller_gang_grows_back_at_the_first_checkpoint_after_every_standby_pod_is_placed() -> None:
    small = shrunk()
    gang = Observed(workers=a_gang("Running", "Running", generation=2), standby=(standby(2, placed=False),))
    running = compute_status(JOB, gang, small.model_copy(update={"last_checkpoint": CheckpointInfo(step=8)}), NOW)
    assert running.elastic is not None
    assert (running.phase, running.nodes_ready, running.elastic.capacity_back_step) == ("Running", "2/2 of 3", None)
    # The standby pod is placed at step 10: the gang grows at the next checkpoint, not at once.
    placed = replace(gang, standby=(standby(2),))
    at_ten = compute_status(JOB, placed, running.model_copy(update={"last_checkpoint": CheckpointInfo(step=10)}), NOW)
    assert at_ten.elastic is not None and (at_ten.phase, at_ten.elastic.capacity_back_step) == ("Running", 10)
    grown = compute_status(JOB, placed, at_ten.model_copy(update={"last_checkpoint": CheckpointInfo(step=12)}), NOW)
    assert grown.elastic is not None
    assert (grown.phase, grown.elastic.nodes, grown.elastic.resizes, grown.restarts) == ("Restarting", 3, 2, 0)
    assert condition(grown, "Restarting") == ("True", "CapacityBack")
    assert [(e.type, e.reason) for e in status_events(at_ten, grown)][-1] == ("Normal", EVENT_GANG_GROWN)
    going = plan_children(JOB, grown, placed, NOW)
    assert {p.name for p in going.delete_pods} == {"mnist-0", "mnist-1", "mnist-standby-2"}
    plan = plan_children(JOB, grown, Observed(), NOW)
    assert (plan.create_ranks, plan.gang_nodes, plan.create_standby_ranks) == ((0, 1, 2), 3, ())


def test_a_standby_pod_is_placed_as_its_worker_would_be_and_runs_nothing() -> None:
    worker, pod = render.render_worker_pod(JOB, 2), render_standby_pod(JOB, 2)
    assert pod["metadata"]["name"] == "mnist-standby-2"
    assert pod["metadata"]["labels"][contract.LABEL_ROLE] == contract.ROLE_STANDBY
    container = pod["spec"]["containers"][0]
    assert container["command"] == STANDBY_COMMAND and container["env"] == []
    assert "hostname" not in pod["spec"] and "subdomain" not in pod["spec"]
    for same in ("securityContext", "volumes", "serviceAccountName", "automountServiceAccountToken"):
        assert pod["spec"].get(same) == worker["spec"].get(same), same
    assert container.get("resources") == worker["spec"]["containers"][0].get("resources")


def test_the_gang_size_and_its_growth_are_kept_in_the_status() -> None:
    status = shrunk().model_copy(update={"last_checkpoint": CheckpointInfo(step=10)})
    assert status.elastic is not None
    status.elastic.capacity_back_step = 10
    previous = read_back(status)
    assert previous.elastic is not None
    assert (previous.elastic.nodes, previous.elastic.resizes, previous.elastic.capacity_back_step) == (2, 1, 10)
