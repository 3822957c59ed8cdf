"""Elastic gangs on the API server: a pod no node takes within waitSeconds shrinks the gang, and a standby pod
holds the place of the node it lacks (the decisions themselves: tests/unit/test_elastic_gang.py)."""

from __future__ import annotations

import pytest

from dtrain_operator.api import contract
from tests.builders import a_cpu_job

from .cluster import Cluster

NS = "default"
pytestmark = pytest.mark.real_apiserver


async def test_a_gang_shrunk_for_want_of_a_node_creates_a_standby_pod_for_it(operated: Cluster):
    job = a_cpu_job("shrinks").with_nodes(3).with_spec(elastic={"minNodes": 2, "waitSeconds": 1}).as_dict()
    await operated.apply(job)
    pods = await operated.eventually(lambda: (p := operated.pods(NS, "shrinks")) and len(p) == 3 and p, "3 worker pods")
    # Ranks 0 and 1 are placed and run; no node takes rank 2.
    for pod in pods[:2]:
        await operated.run(NS, pod["metadata"]["name"])

    await operated.eventually(lambda: (operated.status(NS, "shrinks").get("elastic") or {}).get("nodes") == 2,
                              "the gang shrunk to 2 nodes")
    # The old gang goes (its deletions confirmed as they come) and gang generation 1 is created on 2 nodes.
    smaller = await operated.eventually(
        lambda: (p := operated.pods(NS, "shrinks")) and len(p) == 2
        and {q["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for q in p} == {"1"} and p,
        "2 worker pods of gang generation 1 and none of generation 0",
    )
    for pod in smaller:
        await operated.run(NS, pod["metadata"]["name"])
    standby = await operated.eventually(
        lambda: (p := operated.pods(NS, "shrinks", role=contract.ROLE_STANDBY)) and p, "a standby pod for rank 2"
    )
    assert [(p["metadata"]["name"], p["metadata"]["labels"][contract.LABEL_NODE_RANK]) for p in standby] == [
        ("shrinks-standby-2", "2")
    ]
    await operated.phase(NS, "shrinks", "Running")
    assert operated.status(NS, "shrinks")["restarts"] == 0
