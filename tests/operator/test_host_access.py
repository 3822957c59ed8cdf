"""`dtrain operator --refuse-host-access`: hostNetwork and hostPath only where an administrator said so."""

from __future__ import annotations

import pytest

from dtrain_operator.api import contract
from tests.builders import a_cpu_job

from .cluster import Cluster

HOST_PATH = [{"name": "node-disk", "hostPath": {"path": "/var/lib"}}]
MOUNT = [{"name": "node-disk", "mountPath": "/node"}]

pytestmark = pytest.mark.real_apiserver


async def _namespace(cluster: Cluster, name: str, labels: dict[str, str]) -> None:
    await cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})


async def test_host_access_is_refused_outside_opted_in_namespaces(cluster: Cluster):
    await cluster.start_operator("--refuse-host-access")
    await _namespace(cluster, "team-a", {"pod-security.kubernetes.io/enforce": "baseline"})
    await _namespace(cluster, "rdma", {contract.LABEL_ALLOW_HOST_ACCESS: "true"})

    refused = a_cpu_job("hostnet").in_namespace("team-a").with_nodes(2).with_spec(hostNetwork=True, volumes=HOST_PATH)
    await cluster.apply(refused.with_spec(volumeMounts=MOUNT).as_dict())
    await cluster.phase("team-a", "hostnet", "Failed")
    failed = cluster.condition("team-a", "hostnet", "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.hostNetwork: host access is refused in namespace team-a" in failed["message"]
    assert "spec.volumes[0].hostPath" in failed["message"]
    assert cluster.pods("team-a", "hostnet") == []

    allowed = a_cpu_job("hostnet").in_namespace("rdma").with_nodes(2).with_spec(hostNetwork=True).as_dict()
    await cluster.apply(allowed)
    pods = await cluster.eventually(lambda: len(p := cluster.pods("rdma", "hostnet")) == 2 and p, "2 pods in rdma")
    assert all(p["spec"]["hostNetwork"] for p in pods)

    plain = a_cpu_job("plain").in_namespace("team-a").with_nodes(1).as_dict()
    await cluster.apply(plain)
    await cluster.eventually(lambda: len(cluster.pods("team-a", "plain")) == 1, "a job without host access runs")


async def test_without_the_flag_host_access_is_the_clusters_business(operated: Cluster):
    await operated.apply(a_cpu_job("hostnet").with_nodes(1).with_spec(hostNetwork=True).as_dict())
    pods = await operated.eventually(lambda: len(p := operated.pods("default", "hostnet")) == 1 and p, "the pod")
    assert pods[0]["spec"]["hostNetwork"] is True


async def test_a_status_written_at_create_never_gets_a_pod_with_host_access(cluster: Cluster):
    """A user creates their job with a status of their own, accepting a spec with host access: the API server
    drops a status at create (the status subresource), so the operator accepts or refuses the spec itself."""
    await cluster.start_operator("--refuse-host-access")
    await _namespace(cluster, "team-a", {})
    forged = a_cpu_job("forged").in_namespace("team-a").with_nodes(1).as_dict()
    accepted = {**forged["spec"], "hostNetwork": True, "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                "volumeMounts": [{"name": "root", "mountPath": "/host"}]}
    forged["spec"]["hostNetwork"] = True
    forged["status"] = {"phase": "Running", "restarts": 0, "acceptedSpec": accepted}
    await cluster.apply(forged)
    condition = await cluster.eventually(
        lambda: (c := cluster.condition("team-a", "forged", "Failed")) and c["status"] == "True" and c,
        "the Failed condition",
    )
    assert "spec.hostNetwork" in condition["message"]
    assert cluster.status("team-a", "forged").get("acceptedSpec") is None
    assert cluster.pods("team-a", "forged") == []
