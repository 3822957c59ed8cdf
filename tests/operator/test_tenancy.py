"""Who a job's pods may be (core/tenancy.py), decided by the operator as a process: a job in its own
namespace, as its own account or an account no administrator allowed, gets Failed/InvalidSpec with the
field and the fix, and no pod; an allowed account runs."""

from __future__ import annotations

import pytest

from tests.builders import a_cpu_job

from .cluster import Cluster
from .operator_process import OPERATOR_NAMESPACE

pytestmark = pytest.mark.real_apiserver


async def _refused(cluster: Cluster, namespace: str, name: str, *lines: str) -> None:
    await cluster.phase(namespace, name, "Failed")
    failed = cluster.condition(namespace, name, "Failed")
    assert failed is not None and failed["reason"] == "InvalidSpec"
    for line in lines:
        assert line in failed["message"]
    assert cluster.pods(namespace, name) == []
    assert await cluster.event_reasons(namespace, name, ["Failed"])


async def test_jobs_never_run_as_the_operator_nor_in_its_namespace(cluster: Cluster):
    await cluster.start_operator("--allow-service-account=team-a/iam")
    at_home = a_cpu_job("at-home").in_namespace(OPERATOR_NAMESPACE).with_nodes(1)
    await cluster.apply(at_home.as_dict())
    await _refused(cluster, OPERATOR_NAMESPACE, "at-home", f"metadata.namespace: {OPERATOR_NAMESPACE} is the dtrain "
                   "operator's own namespace")

    as_operator = a_cpu_job("as-operator").in_namespace("team-a").with_nodes(1).with_spec(serviceAccountName="dtrain-operator")
    await cluster.apply(as_operator.as_dict())
    await _refused(cluster, "team-a", "as-operator", "spec.serviceAccountName: dtrain-operator is the dtrain operator's own account")

    stolen = a_cpu_job("stolen-key").in_namespace("team-a").with_nodes(1).with_spec(
        volumes=[{"name": "key", "secret": {"secretName": "dtrain-operator-report-tls"}}],
        volumeMounts=[{"name": "key", "mountPath": "/key"}],
    )
    await cluster.apply(stolen.as_dict())
    await _refused(cluster, "team-a", "stolen-key", "spec.volumes[0].secret.secretName: dtrain-operator-report-tls")

    token = [{"name": "api", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]
    mount = [{"name": "api", "mountPath": "/api"}]
    other = a_cpu_job("other").in_namespace("team-b").with_nodes(1).with_spec(serviceAccountName="iam", volumes=token,
                                                                              volumeMounts=mount)
    await cluster.apply(other.as_dict())
    await _refused(cluster, "team-b", "other", "spec.serviceAccountName: iam is not allowed in namespace team-b")
    api_token = a_cpu_job("api-token").in_namespace("team-b").with_nodes(1).with_spec(volumes=token, volumeMounts=mount)
    await cluster.apply(api_token.as_dict())
    await _refused(cluster, "team-b", "api-token",
                   "spec.volumes[0].projected.sources[0].serviceAccountToken (a token for the Kubernetes API) is allowed only")

    await cluster.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "iam", "namespace": "team-a"}})
    allowed = a_cpu_job("allowed").in_namespace("team-a").with_nodes(1).with_spec(serviceAccountName="iam", volumes=token,
                                                                                  volumeMounts=mount)
    await cluster.apply(allowed.as_dict())
    pods = await cluster.eventually(lambda: len(p := cluster.pods("team-a", "allowed")) == 1 and p, "the allowed job's pod")
    assert pods[0]["spec"]["serviceAccountName"] == "iam"
