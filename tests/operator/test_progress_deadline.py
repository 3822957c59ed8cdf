"""A gang that runs but does not train is restarted (ProgressDeadlineExceeded), its hung pods with a short grace."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

import pytest

from dtrain_operator.api import contract
from dtrain_operator.core.progress_deadline import HUNG_GANG_GRACE_SECONDS, REASON_PROGRESS_DEADLINE
from tests.builders import a_cpu_job

from .cluster import Cluster

NS = "default"
pytestmark = pytest.mark.real_apiserver


def generations(pods: list[dict]) -> set[str]:
    return {p["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for p in pods}


async def report(cluster: Cluster, name: str, batches: int, stage: str = contract.PROGRESS_STAGE_TRAINING) -> None:
    """What rank 0's trainer patches: its batch counter moves only when a batch completes."""
    now = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    await cluster.patch_job_status(
        NS, name, {"progress": {"step": batches, "batches": batches, "batchTime": now, "stage": stage, "updatedAt": now}}
    )


async def test_a_hung_gang_is_restarted_and_a_checkpoint_write_is_not(operated: Cluster):
    deadline = contract.MIN_PROGRESS_DEADLINE_SECONDS  # the shortest a job may set
    await operated.apply(
        a_cpu_job("hang").with_nodes(2).with_backoff_limit(1).with_progress_deadline(deadline).as_dict()
    )
    first = await operated.run_all(NS, "hang", 2)
    await operated.phase(NS, "hang", "Running")
    for batches in range(1, 5):  # healthy: a report every ~deadline/3, for longer than the deadline
        await report(operated, "hang", batches)
        await asyncio.sleep(deadline / 3)
    # A checkpoint write longer than the deadline holds the clock.
    await report(operated, "hang", 4, contract.PROGRESS_STAGE_CHECKPOINTING)
    await asyncio.sleep(deadline + 2)
    assert operated.status(NS, "hang")["restarts"] == 0
    await report(operated, "hang", 5)

    # Now rank 1 blocks in a collective: rank 0 waits with it and reports nothing more.
    hung_at = asyncio.get_running_loop().time()
    await operated.eventually(lambda: operated.status(NS, "hang").get("restarts") == 1, "restarts=1",
                              timeout=deadline + 30)
    took = asyncio.get_running_loop().time() - hung_at
    assert deadline <= took < deadline + 10
    restarting = operated.condition(NS, "hang", "Restarting")
    assert (restarting["status"], restarting["reason"]) == ("True", REASON_PROGRESS_DEADLINE)
    assert f"progressDeadlineSeconds is {deadline}" in restarting["message"] and "at step 5" in restarting["message"]
    # The hung pods cannot checkpoint: they go with a short grace, not terminationGracePeriodSeconds.
    names = [p["metadata"]["name"] for p in first]
    await operated.eventually(
        lambda: all(operated.deletion_grace(NS, n) is not None for n in names), "the hung gang's pods deleted"
    )
    assert {operated.deletion_grace(NS, n) for n in names} == {HUNG_GANG_GRACE_SECONDS}

    await operated.eventually(lambda: generations(operated.pods(NS, "hang")) == {"1"}, "gang generation 1")
    await operated.run_all(NS, "hang", 2)
    await operated.phase(NS, "hang", "Running")
    # Its start takes what it takes: the clock runs from the restarted gang's first report.
    await asyncio.sleep(deadline + 1)
    assert operated.status(NS, "hang")["phase"] == "Running"
    await report(operated, "hang", 1)
    # The restarted gang hangs too: counted against backoffLimit (1), the job fails.
    await operated.phase(NS, "hang", "Failed", timeout=deadline + 30)
    failed = operated.condition(NS, "hang", "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert "no training or validation batch completed" in failed["message"]
    await operated.event_reasons(NS, "hang", ["Running", "Restarting", "Running", "Failed"])


def frame(module: str, function: str, line: int) -> dict:
    return {"module": module, "function": function, "file": f"{module.rsplit('.', 1)[-1]}.py", "line": line}


async def test_the_restart_names_where_the_hang_sits_from_rank_0s_stacks(operated: Cluster):
    await operated.apply(a_cpu_job("where").with_nodes(2).with_backoff_limit(1).with_progress_deadline(contract.MIN_PROGRESS_DEADLINE_SECONDS).as_dict())
    await operated.run_all(NS, "where", 2, on=("node-a", "node-b"))
    await operated.phase(NS, "where", "Running")
    await report(operated, "where", 5)
    # What rank 0 sends a few seconds into the stall, as the report endpoint writes it (stamped with its gang).
    await operated.patch_job_status(NS, "where", {"hangStacks": {
        "gangGeneration": 0, "step": 5, "batches": 5, "worldSize": 2, "dumps": "/workspace/art/hangs/t-step-5",
        "groups": [
            {"ranks": "0", "frames": [frame("torch.autograd.graph", "_engine_run_backward", 841)],
             "code": [frame("dtrain_trainer.runner", "_fit", 326)]},
            {"ranks": "1", "frames": [frame("my_models", "Net.training_step", 52)],
             "code": [frame("my_models", "Net.training_step", 52)]},
        ],
    }})
    await operated.eventually(lambda: operated.status(NS, "where").get("restarts") == 1, "restarts=1",
                              timeout=contract.MIN_PROGRESS_DEADLINE_SECONDS + 30)
    named = "rank 1 (pod where-1 on node node-b) is in its own code at my_models.py:52 in Net.training_step"
    restarting = operated.condition(NS, "where", "Restarting")
    assert restarting["reason"] == REASON_PROGRESS_DEADLINE and named in restarting["message"]
    assert "rank 0 is in the backward pass (DDP's gradient all-reduce) called from runner.py:326 in _fit" in restarting["message"]
    last = operated.status(NS, "where")["lastHang"]
    assert (last["ranks"], last["step"], last["dumps"]) == ("1", 5, "/workspace/art/hangs/t-step-5")
    assert last["message"].startswith(f"Where it hangs: {named}")
    events = await operated.event_reasons(NS, "where", ["Running", "Restarting"])
    assert named in events[1]["message"] and "stacks.txt" in events[1]["message"]


async def test_off_with_zero(operated: Cluster):
    await operated.apply(a_cpu_job("off").with_nodes(1).with_progress_deadline(0).as_dict())
    await operated.run_all(NS, "off", 1)
    await operated.phase(NS, "off", "Running")
    await report(operated, "off", 1)
    await asyncio.sleep(3)
    assert operated.status(NS, "off")["phase"] == "Running"
    assert operated.status(NS, "off")["restarts"] == 0


async def test_a_straggler_gets_a_condition_and_one_warning_event_naming_pod_and_node(operated: Cluster):
    """The pod and node named are the operator's own view of rank 1: never the ones rank 0 reported (a job's code
    could name any node, which an SRE might drain)."""
    await operated.apply(a_cpu_job("slow").with_nodes(2).as_dict())
    await operated.run_all(NS, "slow", 2, on=("node-a", "node-b"))
    await operated.phase(NS, "slow", "Running")
    times = {"medianSeconds": 0.1, "slowestRank": 1, "slowestPod": "victim-0", "slowestNode": "node-victim", "slowChecks": 3}
    for step, ratio in ((50, 3.1), (100, 2.9)):  # still slow at the next comparison: no second Event
        await operated.patch_job_status(
            NS, "slow", {"progress": {"step": step, "stepTimes": {**times, "step": step, "ratio": ratio, "straggler": True}}}
        )
        condition = await operated.eventually(
            lambda: (c := operated.condition(NS, "slow", "Straggler")) and c["status"] == "True" and c, "Straggler condition"
        )
    assert condition["reason"] == "StragglerDetected"
    assert condition["message"].startswith("rank 1 (pod slow-1 on node node-b) is a straggler")
    events = await operated.eventually(
        lambda: (e := [e for e in operated.events(NS, "slow") if e["reason"] == "Straggler"]) and e, "the Straggler event")
    assert len(events) == 1 and events[0]["type"] == "Warning" and "pod slow-1 on node node-b" in events[0]["message"]
    await operated.patch_job_status(
        NS, "slow", {"progress": {"step": 150, "stepTimes": {**times, "step": 150, "ratio": 1.1, "straggler": False}}}
    )
    await operated.eventually(lambda: operated.condition(NS, "slow", "Straggler")["status"] == "False", "cleared")
    assert operated.status(NS, "slow")["restarts"] == 0 and operated.status(NS, "slow")["phase"] == "Running"
