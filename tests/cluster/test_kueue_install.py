"""How `localcluster kueue` changes Kueue's own config/default for this cluster, and nothing else."""

from __future__ import annotations

import yaml
from localcluster import kueue

UPSTREAM_CONFIG = """\
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
health:
  healthProbeBindAddress: :8081
webhook:
  port: 9443
integrations:
  frameworks:
  - "batch/job"
  - "ray.io/rayjob"
"""
RENDERED = yaml.safe_dump_all([
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": kueue.CONFIG_MAP, "namespace": "kueue-system"},
     "data": {kueue.CONFIG_FILE_KEY: UPSTREAM_CONFIG}},
    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": kueue.DEPLOYMENT, "namespace": "kueue-system"},
     "spec": {"template": {"spec": {"containers": [
         {"name": "manager", "image": "us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue:main",
          "args": ["--config=/controller_manager_config.yaml", "--zap-log-level=2"]}]}}}},
    {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
     "metadata": {"name": "kueue-mutating-webhook-configuration"},
     "webhooks": [{"name": "mpod.kb.io", "namespaceSelector": {"matchExpressions": [
         {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kueue-system"]}]}},
                  {"name": "mclusterqueue.kb.io"}]},
    {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": "v1beta1.visibility.kueue.x-k8s.io"}},
    {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kueue-webhook-server-cert", "namespace": "kueue-system"}},
])


def test_the_manager_runs_the_image_built_here_with_the_pod_integration_and_no_visibility_api() -> None:
    objects = {(o["kind"], o["metadata"]["name"]): o for o in kueue.manifests([o for o in yaml.safe_load_all(RENDERED) if o])}
    assert ("APIService", "v1beta1.visibility.kueue.x-k8s.io") not in objects
    assert ("Secret", "kueue-webhook-server-cert") in objects  # Kueue's internal certificates fill it
    container = objects[("Deployment", kueue.DEPLOYMENT)]["spec"]["template"]["spec"]["containers"][0]
    assert (container["image"], container["imagePullPolicy"]) == (f"localhost/kueue/kueue:{kueue.version()}", "Never")
    assert kueue.version() == "v0.19.2"  # go.mod's pin
    assert container["args"][-1] == "--feature-gates=VisibilityOnDemand=false"
    config = yaml.safe_load(objects[("ConfigMap", kueue.CONFIG_MAP)]["data"][kueue.CONFIG_FILE_KEY])
    assert config["integrations"]["frameworks"] == ["batch/job", "pod"]
    assert config["webhook"] == {"port": 9443}  # the rest as upstream wrote it
    exempt = config["managedJobsNamespaceSelector"]["matchExpressions"][0]
    assert exempt["operator"] == "NotIn" and set(exempt["values"]) == {"kube-system", "kueue-system", "dtrain-system"}
    webhooks = objects[("MutatingWebhookConfiguration", "kueue-mutating-webhook-configuration")]["webhooks"]
    for webhook in webhooks:  # the operator's own pods never wait on Kueue's webhooks
        (expression,) = webhook["namespaceSelector"]["matchExpressions"]
        assert set(expression["values"]) == {"kube-system", "kueue-system", "dtrain-system"}
