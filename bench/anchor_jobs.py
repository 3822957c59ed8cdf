"""The anchors' job definitions for bench/anchors.py: the same training under dtrain, JobSet, Kubeflow Trainer
(TrainJob) and the Training Operator (PyTorchJob), and each system's way to its pods, ranks and restarts."""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dtrain_operator.api import DistributedTraining, contract
from dtrain_operator.core import render
from tests.cluster.kube import (
    get,
    items,
    kubectl,
)
from tests.cluster.scenarios.common import CLAIM, NS, QUICKSTART, TRAINER_IMAGE

from localcluster import anchors, layout  # isort: skip  (tests.cluster puts tools/cluster on the path)

WORKSPACE = "/workspace"  # where dtrain mounts spec.storage.claimName in a worker
NODES = 2
MAX_RESTARTS = 3  # every system's restart budget
PROGRESS_DEADLINE_SECONDS = 30  # dtrain's hang detection (runPolicy.progressDeadlineSeconds)
PET_VARIABLES = {contract.ENV_NNODES, contract.ENV_NPROC_PER_NODE, contract.ENV_NODE_RANK, contract.ENV_MASTER_ADDR,
                 contract.ENV_MASTER_PORT}


def training_job(name: str) -> dict[str, Any]:
    """The quick start as dtrain runs it here: its model, data, steps and checkpoint interval; on the claim,
    without the export and engine (not what is compared), with the restart budget every system gets."""
    job = yaml.safe_load(QUICKSTART.read_text())
    job["metadata"] = {"name": name, "namespace": NS}
    spec = job["spec"]
    spec.update(image=TRAINER_IMAGE, storage={"claimName": CLAIM})
    spec["checkpoint"]["dir"] = f"{WORKSPACE}/anchors/{name}/checkpoints"
    spec["artifacts"] = {"dir": f"{WORKSPACE}/anchors/{name}/artifacts"}
    spec["export"] = {"onnx": {"enabled": False}}
    spec["engine"] = {"enabled": False}
    spec["runPolicy"] = {"backoffLimit": MAX_RESTARTS, "progressDeadlineSeconds": PROGRESS_DEADLINE_SECONDS}
    return job


def claim_path(path: str) -> Path:
    """Where a path under the claim's mount lies on this machine (the local provisioner's folder)."""
    return layout.VOLUMES / NS / CLAIM / Path(path).relative_to(WORKSPACE)


@dataclass
class Workload:
    """What every anchor runs: dtrain's own rendering of the job's worker, less what the anchor provides
    (torchrun's gang variables, the pod's name and place) and dtrain's grace period, its records to a file
    on the claim. The trainer's files, which a dtrain pod carries in its annotations, come from a ConfigMap
    created beside the anchor's objects, mounted at the same place."""

    name: str
    config_map: dict[str, Any]
    container: dict[str, Any]
    pod_spec: dict[str, Any]
    records: Path

    @classmethod
    def of(cls, name: str) -> Workload:
        job = DistributedTraining.model_validate(training_job(name))
        records = f"{WORKSPACE}/anchors/{name}/records.jsonl"
        pod = render.render_worker_pod(job, rank=1)
        container = pod["spec"]["containers"][0]
        env = []
        for var in container["env"]:
            if var["name"] in PET_VARIABLES or var["name"] == contract.ENV_SHUTDOWN_TIMEOUT:
                continue  # the anchor's; torchrun's own shutdown timeout, as for the grace period below
            if var["name"] == contract.ENV_PROGRESS_SINK:
                var = {"name": var["name"], "value": f"{contract.PROGRESS_SINK_JSONL_PREFIX}{records}"}
            if var["name"] == contract.ENV_POD_NAME:
                var = {"name": var["name"], "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
            env.append(var)
        container = {**container, "env": env}
        container.pop("ports", None)
        # Not terminationGracePeriodSeconds: dtrain's default (600 s) is for its SIGTERM checkpoint of any
        # size; the anchors' docs set none, so their pods get Kubernetes' 30 s.
        keep = ("serviceAccountName", "automountServiceAccountToken", "enableServiceLinks", "securityContext", "volumes")
        pod_spec = {key: value for key, value in pod["spec"].items() if key in keep}
        config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-config", "namespace": NS},
                      "data": render.trainer_files(job)}
        pod_spec["volumes"] = [{"name": v["name"], "configMap": {"name": config_map["metadata"]["name"]}}
                               if v["name"] == contract.CONFIG_VOLUME else v for v in pod_spec["volumes"]]
        return cls(name, config_map, container, pod_spec, claim_path(records))

    def prepare(self) -> None:
        """A fresh folder for the records, which the trainer's user can write (the trainer does not make it)."""
        shutil.rmtree(self.records.parent, ignore_errors=True)
        self.records.parent.mkdir(parents=True)
        context = self.pod_spec.get("securityContext") or {}
        os.chown(self.records.parent, context.get("runAsUser", -1), context.get("fsGroup", -1))

    def pod_template(self, container_name: str, restart_policy: str, **container: Any) -> dict[str, Any]:
        spec = copy.deepcopy(self.pod_spec)
        spec["restartPolicy"] = restart_policy
        spec["containers"] = [{**copy.deepcopy(self.container), "name": container_name, **container}]
        return {"spec": spec}


# --- The systems -------------------------------------------------------------------------------


@dataclass
class System:
    key: str
    title: str
    kind: str  # what kubectl get takes
    version: str
    controller_users: tuple[str, ...]  # the audit log's users of the system's own controller(s)
    objects: Callable[[Workload], list[dict[str, Any]]]
    rank_pods: Callable[[str], dict[int, dict[str, Any]]]  # node rank → its live pod
    restarts: Callable[[str], int]  # the system's own count of gang restarts

    def failure(self, name: str) -> str | None:
        """Why the job failed, once it has: its Failed condition (every system here has one)."""
        for condition in self.status(name).get("conditions") or []:
            if condition.get("type") == "Failed" and condition.get("status") == "True":
                return f"{self.kind} Failed ({condition.get('reason')}): {condition.get('message')}"
        return None

    def get_text(self, name: str) -> str:
        return kubectl("get", self.kind, name, "-n", NS, check=False).stdout.strip()

    def status(self, name: str) -> dict[str, Any]:
        found = get(self.kind, name, NS)
        return (found or {}).get("status") or {}


def _live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") in ("Pending", "Running")]


def _by_label(selector: str, rank_of: Callable[[dict[str, Any]], int | None]) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for pod in _live(items("pods", NS, selector)):
        rank = rank_of(pod)
        if rank is not None:
            found[rank] = pod
    return found


def _env_rank(pod: dict[str, Any]) -> int | None:
    for var in pod["spec"]["containers"][0].get("env") or []:
        if var["name"] == contract.ENV_NODE_RANK and "value" in var:
            return int(var["value"])
    return None


def _completion_index(pod: dict[str, Any]) -> int | None:
    index = (pod["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index")
    return int(index) if index is not None else None


def dtrain_objects(workload: Workload) -> list[dict[str, Any]]:
    return [training_job(workload.name)]


def jobset_object(name: str, pod_template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name, "namespace": NS},
        "spec": {
            "failurePolicy": {"maxRestarts": MAX_RESTARTS},
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
                "parallelism": NODES, "completions": NODES, "completionMode": "Indexed", "backoffLimit": 0,
                "template": pod_template}}}],
        },
    }


def jobset_objects(workload: Workload) -> list[dict[str, Any]]:
    name = workload.name
    rank_env = [
        {"name": contract.ENV_NNODES, "value": str(NODES)},
        {"name": contract.ENV_NPROC_PER_NODE, "value": "1"},
        {"name": contract.ENV_NODE_RANK, "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        # The index-0 pod of the replicated Job "node", under the JobSet's headless Service (its name).
        {"name": contract.ENV_MASTER_ADDR, "value": f"{name}-node-0-0.{name}"},
        {"name": contract.ENV_MASTER_PORT, "value": "29500"},
    ]
    template = workload.pod_template("trainer", "Never", env=[*rank_env, *workload.container["env"]])
    return [workload.config_map, jobset_object(name, template)]


def trainjob_objects(workload: Workload) -> list[dict[str, Any]]:
    name = workload.name
    runtime_template = workload.pod_template("node", "Never")
    runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
        "metadata": {"name": name, "namespace": NS, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": NODES, "torch": {}},
            "template": {"spec": {
                "failurePolicy": {"maxRestarts": MAX_RESTARTS},
                "replicatedJobs": [{"name": "node", "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"backoffLimit": 0, "template": runtime_template}}}],
            }},
        },
    }
    train_job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": name, "namespace": NS},
        "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": name},
                 "trainer": {"numNodes": NODES, "numProcPerNode": 1}},
    }
    return [workload.config_map, runtime, train_job]


def pytorchjob_objects(workload: Workload) -> list[dict[str, Any]]:
    replica = {"restartPolicy": "OnFailure", "template": workload.pod_template("pytorch", "OnFailure")}
    job = {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": workload.name, "namespace": NS},
        "spec": {
            "nprocPerNode": "1",
            "runPolicy": {"backoffLimit": MAX_RESTARTS, "cleanPodPolicy": "All"},
            "pytorchReplicaSpecs": {"Master": {"replicas": 1, **replica}, "Worker": {"replicas": NODES - 1, **replica}},
        },
    }
    return [workload.config_map, job]


def _container_restarts(selector: str) -> int:
    return sum(s.get("restartCount", 0) for p in items("pods", NS, selector)
               for s in p["status"].get("containerStatuses") or [])


def _jobset_restarts(name: str) -> int:
    found = get("jobset", name, NS)
    return int(((found or {}).get("status") or {}).get("restarts") or 0)


def systems() -> dict[str, System]:
    version = {a.key: a.version() for a in anchors.ANCHORS}
    return {s.key: s for s in (
        System("dtrain", "dtrain", "dtr", layout.version(), ("system:serviceaccount:dtrain-system:",),
               dtrain_objects, lambda n: _by_label(f"{contract.LABEL_JOB_NAME}={n}", _env_rank),
               lambda n: int((get("dtr", n, NS) or {}).get("status", {}).get("restarts") or 0)),
        System("jobset", "JobSet", "jobset", version["jobset"], ("system:serviceaccount:jobset-system:",),
               jobset_objects, lambda n: _by_label(f"jobset.sigs.k8s.io/jobset-name={n}", _completion_index),
               _jobset_restarts),
        System("trainjob", "Kubeflow Trainer (TrainJob)", "trainjob", version["trainer"],
               ("system:serviceaccount:kubeflow-system:", "system:serviceaccount:jobset-system:"),
               trainjob_objects, lambda n: _by_label(f"jobset.sigs.k8s.io/jobset-name={n}", _completion_index),
               _jobset_restarts),
        System("pytorchjob", "Kubeflow Training Operator (PyTorchJob)", "pytorchjob", version["training-operator"],
               ("system:serviceaccount:kubeflow:",), pytorchjob_objects,
               lambda n: _by_label(f"training.kubeflow.org/job-name={n}", _env_rank),
               lambda n: _container_restarts(f"training.kubeflow.org/job-name={n}")),
    )}

