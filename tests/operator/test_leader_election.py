"""Two operator replicas: one holds the Lease and reconciles, the other stands by and takes over
when the leader dies (SIGKILL: after the lease duration) or stops (SIGTERM: it hands the Lease over)."""

from __future__ import annotations

import asyncio
import time

import pytest

from dtrain_operator.api import contract
from tests.builders import a_cpu_job

from .cluster import Cluster
from .operator_process import OPERATOR_NAMESPACE, OperatorProcess

NS = "default"
pytestmark = pytest.mark.real_apiserver
LEASES = "coordination.k8s.io/v1/leases"


def holder(cluster: Cluster) -> str | None:
    # In the operator's own namespace ($POD_NAMESPACE), as in its Deployment.
    leases = [lease for lease in cluster.objects(LEASES, OPERATOR_NAMESPACE) if lease["metadata"]["name"] == "dtrain-operator"]
    return leases[0]["spec"].get("holderIdentity") if leases else None


async def standby(cluster: Cluster, pod_id: str) -> OperatorProcess:
    """Start a second replica and wait until it says it stands by."""
    process = cluster.operator(pod_id=pod_id)
    process.start()
    await cluster.eventually(
        lambda: "is held by dtrain-operator-a; standing by" in process.log.read_text(errors="replace"),
        "the second replica standing by",
    )
    return process


async def leader_and_standby(cluster: Cluster) -> tuple[OperatorProcess, OperatorProcess]:
    leader = await cluster.start_operator(pod_id="dtrain-operator-a")
    assert holder(cluster) == "dtrain-operator-a"
    second = await standby(cluster, "dtrain-operator-b")
    return leader, second


async def test_one_of_two_replicas_reconciles_and_the_other_takes_over_when_it_dies(cluster: Cluster):
    leader, second = await leader_and_standby(cluster)
    await cluster.apply(a_cpu_job("ha").with_nodes(2).as_dict())
    await cluster.run_all(NS, "ha", 2)
    await cluster.phase(NS, "ha", "Running")
    await cluster.event_reasons(NS, "ha", ["Running"])  # once each: one replica acts

    leader.kill()
    killed = time.monotonic()
    await cluster.exit(NS, "ha-1", 1)
    await cluster.eventually(lambda: cluster.status(NS, "ha").get("restarts") == 1, "the new leader's restart", timeout=60)
    failover = time.monotonic() - killed
    print(f"failover after SIGKILL (lease duration 10 s, retry period 2 s): {failover:.1f} s")
    assert holder(cluster) == "dtrain-operator-b"
    assert second.running
    assert failover < 30, failover  # target: under 15 s (measured above)
    # The new gang, not the old one on its way out.
    await cluster.eventually(
        lambda: len(p := cluster.pods(NS, "ha")) == 2
        and {q["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for q in p} == {"1"},
        "the second gang's pods",
    )
    await cluster.run_all(NS, "ha", 2)
    await cluster.phase(NS, "ha", "Running")
    await cluster.event_reasons(NS, "ha", ["Running", "Restarting", "Running"])


async def test_a_replica_that_stops_hands_the_lease_over_at_once(cluster: Cluster):
    leader, _standby = await leader_and_standby(cluster)
    await cluster.apply(a_cpu_job("handover").with_nodes(1).as_dict())
    await cluster.run_all(NS, "handover", 1)
    await cluster.phase(NS, "handover", "Running")

    stopped = time.monotonic()
    assert await asyncio.to_thread(leader.stop) == 0  # in a thread: the API server runs in this loop
    await cluster.exit(NS, "handover-0", 1)
    await cluster.eventually(lambda: cluster.status(NS, "handover").get("restarts") == 1, "the new leader's restart")
    handover = time.monotonic() - stopped
    print(f"handover after SIGTERM (the Lease released): {handover:.1f} s")
    assert holder(cluster) == "dtrain-operator-b"
    assert handover < 15, handover


async def test_a_leader_that_cannot_renew_stops_acting(cluster: Cluster):
    leader = await cluster.start_operator(pod_id="dtrain-operator-a")
    # Another candidate takes the Lease (as after a partition that outlasted the lease duration).
    lease = next(lease for lease in cluster.objects(LEASES, OPERATOR_NAMESPACE)
                 if lease["metadata"]["name"] == "dtrain-operator")
    path = f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases/dtrain-operator"
    await cluster.patch(path, {"spec": {"holderIdentity": "someone-else", "renewTime": lease["spec"]["renewTime"]}})
    await cluster.eventually(lambda: not leader.running, "the old leader exiting", timeout=15)
    assert leader.process is not None and leader.process.returncode == 1
    assert "lost the lease (the lease is held by someone-else)" in leader.log.read_text()
