"""dtrain against its anchors in one run, on one cluster: JobSet, Kubeflow Trainer v2 (TrainJob) and the
Training Operator's PyTorchJob, each from its own controller, measured side by side (`make bench-anchors`).

Needs `make cluster` running (root, network namespaces); `make bench-anchors` installs the anchors first
(`python -m localcluster anchors`: each controller built unmodified from its Go module, tools/cluster/anchors).

The same training under each: examples/quickstart.yaml's model and data, 2 nodes of one CPU process, the
trainer image make cluster built, the same trainer config (the ConfigMap dtrain renders for the job, mounted
at the same path), the same steps and checkpoint interval, on the same claim. The trainer resumes from the
last checkpoint it finds by itself, so each anchor gets resume as dtrain does: what differs is the
orchestration. The anchors' pods have Kubernetes' default grace period (30 s: their docs set none); dtrain's
its own default (600 s, for its SIGTERM checkpoint). Each is launched with torchrun (the trainer image's entrypoint) as its docs recommend, and
configured for fault tolerance as its docs say:

- dtrain: the job file, with runPolicy.backoffLimit and progressDeadlineSeconds (its hang detection);
- JobSet: one replicated Job of 2 indexed pods (backoffLimit 0), failurePolicy.maxRestarts, torchrun's
  master the index-0 pod's hostname and the node rank the completion index (JobSet's PyTorch example);
- Trainer: a TrainingRuntime with the torch ML policy (Trainer sets torchrun's PET_* variables) and the
  JobSet failurePolicy.maxRestarts in its template; a TrainJob of 2 nodes referring to it;
- PyTorchJob: Master and Worker, restartPolicy OnFailure, runPolicy.backoffLimit, nprocPerNode 1
  (the operator sets torchrun's PET_NNODES, PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR and
  PET_MASTER_PORT).

Scenarios, each under each system, one at a time (the hangs of the anchors run together: each waits for
the collective timeout, capped):

1. create → first training step;
2. a worker's training process SIGKILLed → training again, and the steps lost;
3. a worker's node lost (its kubelet stopped with its pods' processes, its Node deleted, its pod deleted)
   → training again (a node joins afterwards, for the next system);
4. rank 1 SIGSTOPped → the gang restarted and training again (capped: the anchors have no progress
   deadline; they wait for the trainer's collective timeout, nccl.timeoutSeconds);
5. the API requests made for the job (kube-apiserver's audit log, by user: the system's controller and
   Kubernetes' own controllers), from create to the last pod gone;
6. what `kubectl get <kind>` and the object's status say at each point, as text.

"Training again" is the trainer's own time of its first progress record after the restart (rank 0 reports
its first step at once after each start): for dtrain as its status shows it (status.progress.updatedAt),
for the anchors from the same records written to a file on the claim (they have no status for it).
Steps lost: the step last reported before the disruption less the step the restarted gang resumed from
(rank 0's "resumed from ... at step N").

`python -m bench.anchors [--systems dtrain,jobset,trainjob,pytorchjob] [--hang-cap-seconds 900]`
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench.common import machine, markdown_table, write_results
from dtrain_operator.api import DistributedTraining, contract
from dtrain_operator.api.records import Event
from dtrain_operator.core import render
from tests.cluster.kube import (
    Failed,
    apply,
    eventually,
    get,
    items,
    kill,
    kubectl,
    localcluster,
    pod_processes,
    trainer_pids,
)
from tests.cluster.scenarios.common import CLAIM, NS, QUICKSTART, TRAINER_IMAGE, lease_holder

from localcluster import anchors, controllers, layout, processes  # isort: skip  (tests.cluster puts tools/cluster on the path)

WORKSPACE = "/workspace"  # where dtrain mounts spec.storage.claimName in a worker
RESULTS = "anchors"
NODES = 2
MAX_RESTARTS = 3  # every system's restart budget
PROGRESS_DEADLINE_SECONDS = 30  # dtrain's hang detection (runPolicy.progressDeadlineSeconds)
STEPS_BEFORE_DISRUPTION = 12  # training steps after a (re)start before the next disruption
START_TIMEOUT = 600.0
RECOVERY_TIMEOUT = 600.0
HANG_CAP_SECONDS = 900.0
POLL_SECONDS = 0.5
PET_VARIABLES = {contract.ENV_NNODES, contract.ENV_NPROC_PER_NODE, contract.ENV_NODE_RANK, contract.ENV_MASTER_ADDR,
                 contract.ENV_MASTER_PORT}


def timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


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
    on the claim."""

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
        return cls(name, render.render_config_map(job), container, pod_spec, claim_path(records))

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


# --- Watching the training ---------------------------------------------------------------------


@dataclass
class Progress:
    """What the training reported, by the trainer's own clock: its steps (time, step), its starts (rank 0's
    trainer coming up) and the steps it resumed from (time, step)."""

    system: System
    name: str
    records: Path
    _offset: int = 0
    steps: list[tuple[float, int]] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    resumes: list[tuple[float, int]] = field(default_factory=list)
    _rank_0: tuple[str, str] | None = None
    failed: str | None = None  # why the job failed, once a wait saw it

    def poll(self) -> None:
        if self.system.key == "dtrain":
            self._poll_dtrain()
        else:
            self._poll_records()

    def _poll_records(self) -> None:
        if not self.records.exists():
            return
        with self.records.open() as file:
            file.seek(self._offset)
            text = file.read()
        complete = text[: text.rfind("\n") + 1]
        self._offset += len(complete.encode())
        for line in complete.splitlines():
            record = json.loads(line)
            moment = timestamp(record["time"])
            if record.get("event") == Event.START:
                self.starts.append(moment)
            elif record.get("event") == Event.RESUMED and record.get("step") is not None:
                self.resumes.append((moment, int(record["step"])))
            elif record.get("event") == Event.PROGRESS and record.get("step"):
                self.steps.append((moment, int(record["step"])))

    def _poll_dtrain(self) -> None:
        """dtrain's status.progress (updatedAt is the record's own time); a start is rank 0's container
        starting in a new pod, whose log says the step it resumed from."""
        progress = self.system.status(self.name).get("progress") or {}
        if progress.get("updatedAt") and progress.get("step"):
            point = (timestamp(progress["updatedAt"]), int(progress["step"]))
            if not self.steps or point != self.steps[-1]:
                self.steps.append(point)
        pod = self.system.rank_pods(self.name).get(0)
        running = next((s["state"]["running"] for s in (pod or {}).get("status", {}).get("containerStatuses") or []
                        if "running" in s.get("state", {})), None)
        if pod is None or running is None or (pod["metadata"]["name"], running["startedAt"]) == self._rank_0:
            return
        self._rank_0 = (pod["metadata"]["name"], running["startedAt"])
        self.starts.append(timestamp(running["startedAt"]))

    def _dtrain_resumed(self) -> int | None:
        """The step rank 0's current trainer resumed from, once its log says so."""
        if self._rank_0 is None:
            return None
        logs = kubectl("logs", self._rank_0[0], "-n", NS, check=False).stdout
        found = re.findall(r"resumed from \S+ at step (\d+)", logs)
        return int(found[-1]) if found else None

    def _wait(self, found: Callable[[], Any], timeout: float) -> Any:
        """found()'s first value that is not None; None at the timeout or once the job has failed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.poll()
            value = found()
            if value is not None:
                return value
            self.failed = self.system.failure(self.name)
            if self.failed:
                return None
            time.sleep(POLL_SECONDS)
        return None

    def first_step_after(self, moment: float, timeout: float) -> tuple[float, int] | None:
        return self._wait(lambda: next((p for p in self.steps if p[0] > moment), None), timeout)

    def start_after(self, moment: float, timeout: float) -> float | None:
        """The first start of rank 0's trainer after `moment`: the gang restarted."""
        return self._wait(lambda: next((t for t in self.starts if t > moment), None), timeout)

    def resumed_after(self, moment: float, timeout: float = 30) -> int | None:
        if self.system.key == "dtrain":
            return self._wait(self._dtrain_resumed, timeout)
        return self._wait(lambda: next((step for t, step in self.resumes if t >= moment), None), timeout)

    def fresh_report(self, at_least: int, timeout: float) -> tuple[float, int]:
        """Wait for a new report of step >= at_least; returns it (a disruption right after it knows its step)."""
        self.poll()
        known = len(self.steps)
        found = self._wait(lambda: self.steps[-1] if len(self.steps) > known and self.steps[-1][1] >= at_least
                           else None, timeout)
        if found is None:
            raise Failed(f"{self.name}: no step {at_least} reported within {timeout:.0f} s")
        return found


def snapshot(system: System, name: str, moment: str) -> dict[str, Any]:
    """What a user sees at a point: kubectl get's table and the object's status (phase, restarts, progress)."""
    status = system.status(name)
    return {"at": moment, "kubectl_get": system.get_text(name), "status": _summary(status)}


def _summary(status: dict[str, Any]) -> dict[str, Any]:
    keep = ("phase", "restarts", "progress", "lastCheckpoint", "conditions", "replicatedJobsStatus",
            "replicaStatuses", "jobsStatus", "startTime", "completionTime")
    summary = {key: status[key] for key in keep if key in status}
    for condition in summary.get("conditions") or []:
        condition.pop("lastTransitionTime", None)
        condition.pop("lastUpdateTime", None)
        condition.pop("lastProbeTime", None)
    return summary


# --- Disruptions -------------------------------------------------------------------------------


def _rank_pod(system: System, name: str, rank: int, timeout: float = 120) -> dict[str, Any]:
    def running() -> dict[str, Any]:
        pod = system.rank_pods(name).get(rank) or {}
        return pod if pod.get("status", {}).get("phase") == "Running" else {}

    return eventually(running, f"{name}: rank {rank}'s pod Running", timeout)


def kill_worker(system: System, name: str) -> dict[str, Any]:
    pod = _rank_pod(system, name, 1)
    pids = trainer_pids(pod)
    if not pids:
        raise Failed(f"{name}: no training process in {pod['metadata']['name']}")
    kill(pids)
    return {"pod": pod["metadata"]["name"], "processes": pids}


def lose_node(system: System, name: str) -> dict[str, Any]:
    """Rank 1's node goes (evacuate_controllers first): its kubelet stops, and with it its pods' processes (as a machine powering off);
    the Node is deleted (as a cloud's node controller does) and so is the pod (as the pod GC would)."""
    pod = _rank_pod(system, name, 1)
    node = pod["spec"]["nodeName"]
    rank_0_node = (system.rank_pods(name).get(0) or {}).get("spec", {}).get("nodeName")
    lost = time.time()
    processes.stop(f"kubelet-{node}")
    kill(pod_processes(pod))
    kubectl("delete", "node", node, "--wait=false")
    kubectl("delete", "pod", pod["metadata"]["name"], "-n", NS, "--grace-period=0", "--force", "--wait=false", check=False)
    return {"pod": pod["metadata"]["name"], "node": node, "rank_0_on_it_too": rank_0_node == node, "at": lost}


# The controllers' namespaces, and their Deployments: a lost node must not take one with it (it would measure
# a controller's failover, not the job's recovery).
CONTROLLERS = {"dtrain-system": "dtrain-operator", **{a.namespace: a.deployment for a in anchors.ANCHORS}}


def evacuate_controllers(node: str) -> list[str]:
    """Move every controller off `node` before it is lost: cordoned, their pods deleted, back when their
    Deployments are available again and their webhooks answer."""
    moved = [f"{p['metadata']['namespace']}/{p['metadata']['name']}" for namespace in CONTROLLERS
             for p in items("pods", namespace) if p["spec"].get("nodeName") == node]
    if not moved:
        return []
    kubectl("cordon", node)
    for pod in moved:
        namespace, pod_name = pod.split("/")
        kubectl("delete", "pod", pod_name, "-n", namespace, "--wait=true", "--timeout=120s")
    for namespace, deployment in CONTROLLERS.items():
        kubectl("rollout", "status", f"deploy/{deployment}", "-n", namespace, "--timeout=180s")
    for anchor in anchors.ANCHORS:
        controllers.wait_for_webhooks(kubectl, anchor.probe, anchor.title,
                                      f"kubectl -n {anchor.namespace} logs deploy/{anchor.deployment}", 180)
    # The operator leads again (its Lease held by a running replica) before the node goes.
    running = {p["metadata"]["name"] for p in items("pods", "dtrain-system") if p["status"].get("phase") == "Running"}
    eventually(lambda: lease_holder() in running,
               "the operator's Lease held by a running replica", 120)
    return moved


def stop_rank_1(system: System, name: str) -> dict[str, Any]:
    pod = _rank_pod(system, name, 1)
    pids = trainer_pids(pod)
    kill(pids, signal.SIGSTOP)
    return {"pod": pod["metadata"]["name"], "processes": pids}


def join_node() -> None:
    if localcluster("join") != 0:
        raise Failed("a node did not join (localcluster join)")


# --- The audit log -----------------------------------------------------------------------------


def audit_requests(start: float, end: float) -> Counter[str]:
    """Requests in the benchmark's namespace between two moments, by user (not the benchmark's own: the admin)."""
    counted: Counter[str] = Counter()
    seen: set[str] = set()
    with layout.AUDIT_LOG.open() as log:
        for line in log:
            event = json.loads(line)
            if event["auditID"] in seen:
                continue
            seen.add(event["auditID"])
            ref = event.get("objectRef") or {}
            user = (event.get("user") or {}).get("username", "")
            if ref.get("namespace") != NS or user == "kubernetes-admin":
                continue
            if not start <= timestamp(event["requestReceivedTimestamp"]) <= end:
                continue
            counted[user] += 1
    return counted


# --- One system through the scenarios ----------------------------------------------------------


def delete(system: System, name: str, workload: Workload) -> None:
    kubectl("delete", system.kind, name, "-n", NS, "--wait=false", check=False)
    if system.key == "trainjob":
        kubectl("delete", "trainingruntime", name, "-n", NS, "--wait=false", check=False)
    if system.key != "dtrain":
        kubectl("delete", "configmap", workload.config_map["metadata"]["name"], "-n", NS, "--wait=false", check=False)
    # Its pods at once (a SIGSTOPped rank would hold its pod for the whole grace period): cleanup, not measured.
    for pod in items("pods", NS):
        if pod["metadata"]["name"].startswith(f"{name}-"):
            kubectl("delete", "pod", pod["metadata"]["name"], "-n", NS, "--grace-period=0", "--force", "--wait=false",
                    check=False)
    eventually(lambda: not items("pods", NS, f"{contract.LABEL_JOB_NAME}={name}") and not [
        p for p in items("pods", NS) if p["metadata"]["name"].startswith(f"{name}-")], f"{name}: every pod gone", 300)


def create(system: System, workload: Workload) -> float:
    """Apply the system's objects, the job's own last; returns the wall-clock moment it was applied."""
    *before, job = system.objects(workload)
    for obj in before:
        apply(obj)
    created = time.time()
    apply(job)
    return created


def recovery(system: System, name: str, progress: Progress, disrupted: float, before: tuple[float, int],
             timeout: float) -> dict[str, Any]:
    """From a disruption to the restarted gang's first step: seconds, the step it resumed from, steps lost."""
    restarted = progress.start_after(disrupted, timeout)
    again = progress.first_step_after(restarted, timeout) if restarted is not None else None
    if restarted is None or again is None:
        return {"training_again_s": None, "restarts": system.restarts(name),
                "what_happened": progress.failed or f"no {'step' if restarted else 'restart'} within {timeout:.0f} s"}
    resumed = progress.resumed_after(restarted)
    return {"restarted_s": round(restarted - disrupted, 1), "training_again_s": round(again[0] - disrupted, 1),
            "step_before": before[1], "resumed_from": resumed,
            "steps_lost": before[1] - resumed if resumed is not None else None, "restarts": system.restarts(name)}


def run_scenarios(system: System, result: dict[str, Any]) -> None:
    """Create, kill a worker, lose a node, under one system; the hang separately (hang_job)."""
    name = f"anchors-{system.key}"
    workload = Workload.of(name)
    workload.prepare()
    progress = Progress(system, name, workload.records)
    created = create(system, workload)
    try:
        scenarios(system, name, progress, created, result)
    finally:
        delete(system, name, workload)
        result["api_requests"] = api_summary(system, audit_requests(created - 1, time.time()))


def scenarios(system: System, name: str, progress: Progress, created: float, result: dict[str, Any]) -> None:
    first = progress.first_step_after(created, START_TIMEOUT)
    if first is None:
        raise Failed(f"{name}: no training step within {START_TIMEOUT:.0f} s of create")
    result["create_to_first_step_s"] = round(first[0] - created, 1)
    result["points"].append(snapshot(system, name, "first training step"))

    before = progress.fresh_report(first[1] + STEPS_BEFORE_DISRUPTION, RECOVERY_TIMEOUT)
    disrupted = time.time()
    result["worker_killed"] = kill_worker(system, name)
    time.sleep(2)
    result["points"].append(snapshot(system, name, "2 s after a worker was killed"))
    result["worker_killed"].update(recovery(system, name, progress, disrupted, before, RECOVERY_TIMEOUT))
    result["points"].append(snapshot(system, name, "training again after the kill"))

    if result["worker_killed"]["training_again_s"] is not None:
        again_step = progress.steps[-1][1]
        moved = evacuate_controllers(_rank_pod(system, name, 1)["spec"]["nodeName"])
        before = progress.fresh_report(again_step + STEPS_BEFORE_DISRUPTION, RECOVERY_TIMEOUT)
        result["node_lost"] = {**lose_node(system, name), "controllers_moved_first": moved}
        disrupted = result["node_lost"].pop("at")
        time.sleep(2)
        result["points"].append(snapshot(system, name, "2 s after rank 1's node was lost"))
        result["node_lost"].update(recovery(system, name, progress, disrupted, before, RECOVERY_TIMEOUT))
        result["points"].append(snapshot(system, name, "after the node loss"))
        join_node()


def api_summary(system: System, counted: Counter[str]) -> dict[str, Any]:
    own = sum(n for user, n in counted.items() if user.startswith(system.controller_users))
    kubernetes = sum(n for user, n in counted.items() if user.startswith(("system:serviceaccount:kube-system:",
                                                                           "system:kube-scheduler")))
    return {"controller": own, "kubernetes_controllers": kubernetes, "by_user": dict(counted.most_common())}


def hang_job(system: System, hang_cap: float) -> dict[str, Any]:
    """Rank 1 SIGSTOPped in training: until the gang is restarted and trains again (or the cap)."""
    name = f"anchors-{system.key}-hang"
    workload = Workload.of(name)
    workload.prepare()
    progress = Progress(system, name, workload.records)
    created = create(system, workload)
    first = progress.first_step_after(created, START_TIMEOUT)
    if first is None:
        raise Failed(f"{name}: no training step within {START_TIMEOUT:.0f} s of create")
    before = progress.fresh_report(first[1] + STEPS_BEFORE_DISRUPTION, RECOVERY_TIMEOUT)
    stopped = time.time()
    result: dict[str, Any] = {"stopped": stop_rank_1(system, name), "points": []}
    restarted = progress.start_after(stopped, hang_cap)
    result["points"].append(snapshot(system, name, "restarted" if restarted else f"after {hang_cap:.0f} s hung"))
    if restarted is None:
        result.update(restarted_s=None, training_again_s=None, what_happened=progress.failed or (
            f"no restart within the {hang_cap:.0f} s cap: the other rank waits in the collective (nccl.timeoutSeconds)"))
    else:
        result.update(recovery(system, name, progress, stopped, before, RECOVERY_TIMEOUT))
        result["points"].append(snapshot(system, name, "after the hang"))
    delete(system, name, workload)
    return result


def hang_jobs(group: list[System], hang_cap: float) -> dict[str, dict[str, Any]]:
    """hang_job under each system of the group at once; a system whose scenario fails says so."""
    outcome: dict[str, dict[str, Any]] = {}

    def hang(system: System) -> None:
        try:
            outcome[system.key] = hang_job(system, hang_cap)
        except Exception as exc:  # noqa: BLE001 - one system's failure is recorded, the others go on
            outcome[system.key] = {"what_happened": f"the scenario failed: {exc}"}
            print(f"{system.title}: the hang scenario failed: {exc}", flush=True)

    threads = [threading.Thread(target=hang, args=(system,)) for system in group]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcome


# --- The table ---------------------------------------------------------------------------------


def _seconds(value: Any, otherwise: str = "n/a") -> Any:
    """The figure, or what happened instead, up to its first colon (the JSON has all of it)."""
    return value if value is not None else otherwise.split(":", 1)[0]


def table(results: dict[str, dict[str, Any]], hang_cap: float) -> str:
    headers = ["", *(f"{r['system']} {r['version']}" for r in results.values())]
    rows = [
        ["create → first training step (s)", *(r.get("create_to_first_step_s") for r in results.values())],
        ["worker killed → gang restarted (s)",
         *(_seconds(r.get("worker_killed", {}).get("restarted_s"), r.get("worker_killed", {}).get("what_happened", "n/a"))
           for r in results.values())],
        ["worker killed → training again (s)",
         *(_seconds(r.get("worker_killed", {}).get("training_again_s"), r.get("worker_killed", {}).get("what_happened", "n/a"))
           for r in results.values())],
        ["steps lost (worker killed)", *(_seconds(r.get("worker_killed", {}).get("steps_lost")) for r in results.values())],
        ["node lost → gang restarted (s)",
         *(_seconds(r.get("node_lost", {}).get("restarted_s"), r.get("node_lost", {}).get("what_happened", "n/a"))
           for r in results.values())],
        ["node lost → training again (s)",
         *(_seconds(r.get("node_lost", {}).get("training_again_s"), r.get("node_lost", {}).get("what_happened", "n/a"))
           for r in results.values())],
        [f"rank hung → gang restarted (s; cap {hang_cap:.0f})",
         *(_seconds(r.get("hang", {}).get("restarted_s"), f"not within {hang_cap:.0f} s") for r in results.values())],
        ["rank hung → training again (s)",
         *(_seconds(r.get("hang", {}).get("training_again_s"), "—") for r in results.values())],
        ["API requests per job: its controller", *(r.get("api_requests", {}).get("controller") for r in results.values())],
        ["API requests per job: Kubernetes' controllers",
         *(r.get("api_requests", {}).get("kubernetes_controllers") for r in results.values())],
    ]
    return markdown_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.anchors", description=__doc__.splitlines()[0])
    every = ["dtrain", "jobset", "trainjob", "pytorchjob"]
    parser.add_argument("--systems", default=",".join(every), help=f"comma-separated, of {', '.join(every)}")
    parser.add_argument("--hang-cap-seconds", type=float, default=HANG_CAP_SECONDS)
    parser.add_argument("--out", help="the JSON results (default bench/results/anchors.json)")
    args = parser.parse_args(argv)
    chosen = [key.strip() for key in args.systems.split(",") if key.strip()]
    unknown = [key for key in chosen if key not in every]
    if unknown:
        parser.error(f"unknown system {unknown[0]!r}: --systems takes {', '.join(every)}")
    if localcluster("status") != 0:
        print("bench-anchors: no cluster runs here: make cluster first", file=sys.stderr)
        return 2
    localcluster("volume", CLAIM, "-n", NS)
    known = systems()
    started = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    for key in chosen:
        print(f"\n=== {known[key].title} {known[key].version}: create, worker killed, node lost", flush=True)
        results[key] = {"system": known[key].title, "version": known[key].version, "points": []}
        try:
            run_scenarios(known[key], results[key])
        except Exception as exc:  # noqa: BLE001 - one system's failure is recorded (with what it measured), the next runs
            print(f"{known[key].title}: FAILED: {exc}", flush=True)
            results[key]["failed"] = str(exc)
        print(json.dumps({k: v for k, v in results[key].items() if k != "points"}, indent=1), flush=True)
    # The hangs: dtrain's alone (it restarts within its deadline), then the anchors' together (each waits
    # for the collective timeout or the cap; a stopped rank uses no CPU).
    hangs = [key for key in chosen if key == "dtrain"], [key for key in chosen if key != "dtrain"]
    for group in hangs:
        if not group:
            continue
        print(f"\n=== rank 1 SIGSTOPped under {', '.join(known[k].title for k in group)} (cap {args.hang_cap_seconds:.0f} s)",
              flush=True)
        outcome = hang_jobs([known[key] for key in group], args.hang_cap_seconds)
        for key in group:
            results[key]["hang"] = outcome[key]
    server = json.loads(kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    text = table(results, args.hang_cap_seconds)
    print(f"\ndtrain and its anchors on Kubernetes {server} ({time.strftime('%Y-%m-%d')}, "
          f"{time.monotonic() - started:.0f} s):\n\n{text}")
    path = write_results(RESULTS, {"kubernetes": server, "machine": machine(), "hang_cap_seconds": args.hang_cap_seconds,
                                   "systems": results, "table": text}, args.out)
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
