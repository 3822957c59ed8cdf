"""The anchors dtrain is measured against (`python -m localcluster anchors`, `make bench-anchors`).

JobSet, Kubeflow Trainer v2 (TrainJob, which runs on JobSet) and the Kubeflow Training Operator v1
(PyTorchJob): each manager built unmodified from its Go module (tools/cluster/anchors: go.mod and go.sum pin
the releases; one module, so Go resolves their shared Kubernetes modules once, to v0.36.3) into an image of
its own, and installed from the module's own manifests as each project's docs install it (controllers.py).
Changed only where this cluster needs it: the Deployments run the images built here, and Trainer's overlay
is rendered without its third-party/jobset, which downloads JobSet's release manifests (JobSet is installed
here from its own module instead, the same release Trainer's go.mod requires). The controllers use their
own internal certificates for their webhooks, as their default manifests do.

One change to the Training Operator's configuration, through its own flag: a PyTorchJob's workers get no
init container (--pytorch-init-container-template-file names a template of none). Its default one runs
`nslookup` of the master in an alpine image until it answers: this cluster has neither a registry to pull
alpine from nor a DNS server (pods' hosts files name the Services), and its kubelet runs one container per
pod. Without it a worker's torchrun waits for the master by itself (its rendezvous store retries).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import controllers, controlplane, layout

MODULE = layout.REPO / "tools" / "cluster" / "anchors"


@dataclass(frozen=True)
class Anchor:
    key: str
    title: str
    package: str  # the Go module
    command: str  # its manager's main package
    namespace: str
    deployment: str
    manifests: str  # the directory of the module whose kustomization installs it
    probe: dict[str, Any]  # an object its webhooks admit: a server-side dry run of it says they answer
    version_variable: str | None = None  # where its Makefile stamps the release (-X)

    def version(self) -> str:
        return controlplane.required_version(MODULE, self.package)

    @property
    def binary(self) -> Path:
        return layout.BIN / self.key

    def image(self) -> str:
        return f"localhost/anchors/{self.key}:{self.version()}"

    def module_dir(self) -> Path:
        return controlplane.module_dir(MODULE, self.package)


def _pod_template(image: str) -> dict[str, Any]:
    return {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": image}]}}


JOBSET = Anchor(
    key="jobset", title="JobSet", package="sigs.k8s.io/jobset", command="sigs.k8s.io/jobset",
    namespace="jobset-system", deployment="jobset-controller-manager", manifests="config/default",
    probe={"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
           "metadata": {"name": "localcluster-probe", "namespace": "default"},
           "spec": {"replicatedJobs": [{"name": "w", "replicas": 1,
                                        "template": {"spec": {"template": _pod_template("probe")}}}]}},
    version_variable="sigs.k8s.io/jobset/pkg/version.GitVersion",  # its Makefile's version_pkg
)
TRAINER = Anchor(
    key="trainer", title="Kubeflow Trainer", package="github.com/kubeflow/trainer/v2",
    command="github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
    namespace="kubeflow-system", deployment="kubeflow-trainer-controller-manager", manifests="manifests/overlays/manager",
    probe={"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
           "metadata": {"name": "localcluster-probe"},
           "spec": {"mlPolicy": {"numNodes": 1, "torch": {}},
                    "template": {"spec": {"replicatedJobs": [
                        {"name": "node", "template": {
                            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                            "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "probe"}]}}}}}]}}}},
)
TRAINING_OPERATOR = Anchor(
    key="training-operator", title="Kubeflow Training Operator", package="github.com/kubeflow/training-operator",
    command="github.com/kubeflow/training-operator/cmd/training-operator.v1",
    namespace="kubeflow", deployment="training-operator", manifests="manifests/overlays/standalone",
    probe={"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": "localcluster-probe", "namespace": "default"},
           "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1, "template": {
               "spec": {"containers": [{"name": "pytorch", "image": "probe"}]}}}}}},
)
# In install order: Trainer runs its TrainJobs as JobSets.
ANCHORS = (JOBSET, TRAINER, TRAINING_OPERATOR)
# Trainer's overlay installs JobSet from a release URL (this line); JobSet comes from its module here.
TRAINER_THIRD_PARTY_JOBSET = "../../third-party/jobset"


def build(anchor: Anchor) -> None:
    flags = ["-trimpath", "-ldflags=-s -w" + (f" -X {anchor.version_variable}={anchor.version()}"
                                               if anchor.version_variable else "")]
    controlplane.build_from_module(
        MODULE, anchor.command, anchor.binary, flags,
        f"cluster: building {anchor.title} {anchor.version()} from its Go module (the three anchors take ~3 min "
        "on 2 cores the first time, sharing their Kubernetes modules; Go's caches make the next build a link)",
        env={"CGO_ENABLED": "0"},
    )


def overlay_without_jobset(overlay: Path, folder: Path) -> Path:
    """Trainer's overlay as its own file writes it, less the third-party JobSet, in `folder`: its bases are
    referred to where the module keeps them, its own files copied beside it."""
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    resources = []
    for resource in kustomization["resources"]:
        if resource == TRAINER_THIRD_PARTY_JOBSET:
            continue
        source = (overlay / resource).resolve()
        if source.is_dir():
            resources.append(os.path.relpath(source, folder))  # kustomize takes no absolute bases
        else:
            (folder / source.name).write_text(source.read_text())
            resources.append(source.name)
    if len(resources) != len(kustomization["resources"]) - 1:
        raise RuntimeError(f"{overlay}/kustomization.yaml no longer lists {TRAINER_THIRD_PARTY_JOBSET}: check how "
                           "this Trainer release installs JobSet")
    kustomization["resources"] = resources
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return folder


INIT_CONTAINERS_CONFIG_MAP = "training-operator-pytorch-init-container"
INIT_CONTAINERS_DIR = "/etc/training-operator"
INIT_CONTAINERS_FILE = "init-containers.yaml"


def without_pytorch_init_container(deployment: dict[str, Any]) -> dict[str, Any]:
    """The ConfigMap of a template of no init container, mounted where the operator's flag names it."""
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    container["args"] = [*container.get("args", []),
                         f"--pytorch-init-container-template-file={INIT_CONTAINERS_DIR}/{INIT_CONTAINERS_FILE}"]
    container.setdefault("volumeMounts", []).append(
        {"name": "pytorch-init-container", "mountPath": INIT_CONTAINERS_DIR, "readOnly": True})
    pod.setdefault("volumes", []).append(
        {"name": "pytorch-init-container", "configMap": {"name": INIT_CONTAINERS_CONFIG_MAP}})
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": INIT_CONTAINERS_CONFIG_MAP, "namespace": deployment["metadata"]["namespace"]},
            "data": {INIT_CONTAINERS_FILE: "[]\n"}}


def manifests(anchor: Anchor, rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The module's objects with its manager's Deployment running the image built here (and, for the
    Training Operator, no PyTorchJob init container: the module docstring says why)."""
    deployments = [o for o in rendered if o["kind"] == "Deployment" and o["metadata"]["name"] == anchor.deployment]
    if len(deployments) != 1:
        raise RuntimeError(f"{anchor.title}'s manifests have no Deployment {anchor.deployment}")
    controllers.run_local_image(deployments[0], anchor.image())
    if anchor is TRAINING_OPERATOR:
        return [*rendered, without_pytorch_init_container(deployments[0])]
    return rendered


def render(anchor: Anchor) -> list[dict[str, Any]]:
    source = anchor.module_dir() / anchor.manifests
    what = f"{anchor.title}'s {anchor.manifests}"
    if anchor is TRAINER:
        with tempfile.TemporaryDirectory(prefix="trainer-overlay-") as folder:
            return manifests(anchor, controllers.kustomize(overlay_without_jobset(source, Path(folder)), what))
    return manifests(anchor, controllers.kustomize(source, what))


def install(anchor: Anchor, kubectl: controllers.Kubectl, timeout: float = 300) -> None:
    build(anchor)
    controllers.manager_image(anchor.binary, anchor.image())
    print(f"cluster: installing {anchor.title} {anchor.version()} ({anchor.manifests}) in {anchor.namespace}", flush=True)
    controllers.install(kubectl, render(anchor), anchor.probe, anchor.title,
                        f"kubectl -n {anchor.namespace} logs deploy/{anchor.deployment}", timeout)
