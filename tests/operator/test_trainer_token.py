"""What a worker's own token can do to the operator, with the chart's RBAC enforced by the API server.

The trainer's service account may patch the status of every DistributedTraining in its namespace
(RBAC cannot say less; on Kubernetes 1.30+ the chart's admission policy does, see
tests/chart/test_trainer_admission_policy.py). Here no admission policy runs, as on an older
cluster: even so, a forged status must not choose the next gang, reset the restart count, or
take over another job.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dtrain_operator.api import contract
from tests.builders import a_cpu_job

from .authz import Authorizer, User
from .cluster import OPERATOR_NAMESPACE, Cluster, running_cluster

NS = OPERATOR_NAMESPACE  # where the chart binds the trainer's service account when watching all
IMAGE = "registry.example/team/trainer:1.4"


@pytest.fixture
async def rbac_cluster(tmp_path: Path) -> AsyncIterator[tuple[Cluster, str]]:
    from tests.chart.helm import helm_template

    kinds = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    authorizer = Authorizer([o for o in helm_template(namespace=NS) if o["kind"] in kinds])
    trainer = authorizer.issue(User.service_account(NS, contract.DEFAULT_WORKER_SERVICE_ACCOUNT))
    async with running_cluster(tmp_path, authorizer) as cluster:
        # The Lease lives where the chart's Role for it does: the operator's own namespace.
        await cluster.start_operator(f"--leader-elect-resource-namespace={OPERATOR_NAMESPACE}")
        yield cluster, trainer


async def _as(cluster: Cluster, token: str, method: str, path: str, body: dict) -> int:
    headers = {"Content-Type": "application/merge-patch+json", "Authorization": f"Bearer {token}"}
    async with cluster.api.request(method, path, json=body, headers=headers) as response:
        return response.status


def _path(name: str, sub: str = "") -> str:
    return f"/apis/{contract.API_VERSION}/namespaces/{NS}/{contract.PLURAL}/{name}" + (f"/{sub}" if sub else "")


def _generation(pods: list[dict]) -> set[str]:
    return {p["metadata"]["labels"][contract.LABEL_GANG_GENERATION] for p in pods}


async def test_a_forged_status_changes_nothing_the_operator_creates(rbac_cluster):
    cluster, trainer = rbac_cluster
    victim = a_cpu_job("victim").in_namespace(NS).with_nodes(2).with_backoff_limit(5).with_spec(image=IMAGE)
    await cluster.apply(victim.as_dict())
    await cluster.apply(a_cpu_job("neighbour").in_namespace(NS).with_nodes(1).with_backoff_limit(1).as_dict())
    await cluster.run_all(NS, "victim", 2)
    await cluster.run_all(NS, "neighbour", 1)
    await cluster.phase(NS, "victim", "Running")
    await cluster.phase(NS, "neighbour", "Running")
    await cluster.exit(NS, "neighbour-0", 1)
    await cluster.eventually(lambda: cluster.status(NS, "neighbour").get("restarts") == 1, "the neighbour's restart")

    accepted = cluster.status(NS, "victim")["acceptedSpec"]
    evil = {**accepted, "image": "attacker/evil:1", "serviceAccountName": "namespace-admin", "hostNetwork": True,
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}
    # RBAC lets the trainer's token through for the status...
    assert await _as(cluster, trainer, "PATCH", _path("victim", "status"), {"status": {"acceptedSpec": evil, "restarts": 0}}) == 200
    assert await _as(cluster, trainer, "PATCH", _path("neighbour", "status"), {"status": {"restarts": 0, "phase": "Running"}}) == 200
    # ...but not to the operator's own record, which lives on the object.
    record = {"metadata": {"annotations": {contract.ANNOTATION_STATE: "{}"}}}
    assert await _as(cluster, trainer, "PATCH", _path("victim"), record) == 403

    await cluster.exit(NS, "victim-1", 1)
    pods = await cluster.eventually(
        lambda: len(p := cluster.pods(NS, "victim")) == 2 and _generation(p) == {"1"} and p, "the next gang"
    )
    for pod in pods:
        spec = pod["spec"]
        assert [c["image"] for c in spec["containers"]] == [IMAGE]
        assert spec["serviceAccountName"] == contract.DEFAULT_WORKER_SERVICE_ACCOUNT
        assert not spec.get("hostNetwork")
        assert not any("hostPath" in v for v in spec["volumes"])
    await cluster.eventually(
        lambda: (s := cluster.status(NS, "victim")).get("restarts") == 1 and s.get("acceptedSpec") == accepted,
        "the restart counted and the accepted spec written back",
    )
    # The neighbour's count kept climbing: its backoff limit of 1 is spent by the next failure.
    await cluster.eventually(lambda: cluster.status(NS, "neighbour").get("restarts") == 1, "restarts written back")
    await cluster.run_all(NS, "neighbour", 1)
    await cluster.exit(NS, "neighbour-0", 1)
    await cluster.phase(NS, "neighbour", "Failed")
    assert cluster.condition(NS, "neighbour", "Failed")["reason"] == "BackoffLimitExceeded"
