"""The lifecycle's edges: pods that take their time to terminate, pods that finished and went,
gangs that cannot start, stale progress. Pods are held by a finalizer the way a kubelet's
graceful termination holds them (kubelet.py)."""

from __future__ import annotations

import asyncio

from dtrain_operator import contract

from . import kubelet
from .cluster import Cluster, a_job

NS = "default"


def generations(pods: list[dict]) -> set[str]:
    return {p["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for p in pods}


async def test_resume_before_the_suspended_pods_are_gone_counts_no_failure(operated: Cluster):
    await operated.apply(a_job("preempted").nodes(2).restart_policy("Never").build())
    pods = await operated.run_all(NS, "preempted", 2)
    await operated.phase(NS, "preempted", "Running")
    await kubelet.hold_all(operated, NS, pods)

    # Kueue-style preempt and readmit: suspended, and resumed while the pods still terminate.
    await operated.patch_job(NS, "preempted", {"spec": {"runPolicy": {"suspend": True}}})
    await operated.phase(NS, "preempted", "Suspended")
    await operated.eventually(lambda: len(kubelet.terminating(operated, NS, "preempted")) == 2, "2 pods terminating")
    await operated.patch_job(NS, "preempted", {"spec": {"runPolicy": {"suspend": False}}})
    await operated.phase(NS, "preempted", "Pending")
    await asyncio.sleep(0.5)
    status = operated.status(NS, "preempted")
    assert (status["phase"], status["restarts"]) == ("Pending", 0)

    # The old containers exit (SIGTERM) and the pods go: the same gang starts again.
    for name in ("preempted-0", "preempted-1"):
        await kubelet.finish_termination(operated, NS, name)
    new = await operated.eventually(
        lambda: len(p := operated.pods(NS, "preempted")) == 2 and not kubelet.terminating(operated, NS, "preempted") and p,
        "the new pods, once the old ones are gone",
    )
    assert generations(new) == {"0"}
    await operated.run_all(NS, "preempted", 2)
    status = await operated.phase(NS, "preempted", "Running")
    assert status["restarts"] == 0
    await operated.event_reasons(NS, "preempted", ["Pending", "Running", "Suspended", "Pending", "Running"])
