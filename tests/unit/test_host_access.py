"""Host access outside an opted-in namespace is refused, naming the field."""

from __future__ import annotations

from dtrain_operator.api import DistributedTrainingSpec, contract
from dtrain_operator.core.host_access import host_access_fields, host_access_refusals

HOST_PATH = {"name": "node-disk", "hostPath": {"path": "/"}}
PVC = {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}


def spec(**fields) -> DistributedTrainingSpec:
    return DistributedTrainingSpec.model_validate({"nodes": 2, **fields})


def test_a_plain_job_asks_for_nothing():
    assert host_access_fields(spec(volumes=[PVC])) == []
    assert host_access_refusals(spec(volumes=[PVC]), "team-a", {}) == []


def test_host_network_and_host_path_are_named():
    job = spec(hostNetwork=True, volumes=[PVC, HOST_PATH])
    assert host_access_fields(job) == ["spec.hostNetwork", "spec.volumes[1].hostPath"]
    refusals = host_access_refusals(job, "team-a", {"pod-security.kubernetes.io/enforce": "restricted"})
    assert [line.split(":")[0] for line in refusals] == ["spec.hostNetwork", "spec.volumes[1].hostPath"]
    assert f"kubectl label namespace team-a {contract.LABEL_ALLOW_HOST_ACCESS}=true" in refusals[0]


def test_an_opted_in_namespace_allows_it():
    job = spec(hostNetwork=True, volumes=[HOST_PATH])
    assert host_access_refusals(job, "rdma", {contract.LABEL_ALLOW_HOST_ACCESS: "true"}) == []
    assert host_access_refusals(job, "rdma", {contract.LABEL_ALLOW_HOST_ACCESS: "yes"}) != []
