"""The scenarios on the real control plane: the user's path with kubectl, a worker killed, and what
the API server itself enforces (the CRD's rules, the chart's admission policies and RBAC, checked
with the users' and the pods' own credentials)."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable
from typing import Any

import yaml

from dtrain_operator.api import contract

from .kube import (
    REPO,
    Failed,
    apply,
    eventually,
    get,
    items,
    kill,
    kubectl,
    request_with_token,
    status,
    token_kubeconfig,
    trainer_pids,
    user_kubeconfig,
    worker_pods,
)

NS = "default"
SMALL_JOB = REPO / "tests" / "e2e" / "small-job.yaml"
CLAIM = "e2e-data"
TRAINER_IMAGE = "localhost/dtrain/dtrain-trainer:0.1.0"
ENGINE_IMAGE = "localhost/dtrain/dtrain-engine:0.1.0"
Figures = dict[str, float]


def small_job(name: str, **spec: Any) -> dict[str, Any]:
    """The e2e's small job as a user writes it for this cluster: the images, a shared claim, and an
    engine step that falls back to ONNX Runtime (no TensorRT, no GPU here)."""
    job = yaml.safe_load(SMALL_JOB.read_text())
    job["metadata"] = {"name": name, "namespace": NS}
    job["spec"].update(image=TRAINER_IMAGE, storage={"claimName": CLAIM})
    job["spec"]["checkpoint"]["dir"] = f"/workspace/{name}/checkpoints"
    job["spec"]["artifacts"] = {"dir": f"/workspace/{name}/artifacts"}
    job["spec"].update(spec)
    return job


def with_engine(job: dict[str, Any]) -> dict[str, Any]:
    job = copy.deepcopy(job)
    job["spec"]["export"] = {"onnx": {"enabled": True, "opset": 17, "dynamicBatch": True}}
    job["spec"]["engine"] = {"enabled": True, "image": ENGINE_IMAGE, "precision": "fp32", "maxBatch": 8,
                             "fallback": "onnxruntime", "resources": {"limits": {"cpu": "1", "memory": "4Gi"}}}
    return job


def progress_step(name: str) -> int:
    return int((status(name).get("progress") or {}).get("step") or 0)


def finished(name: str, timeout: float = 600) -> dict[str, Any]:
    final = eventually(lambda: status(name).get("phase") in ("Succeeded", "Failed") and status(name),
                       f"{name} to finish", timeout)
    if final["phase"] != "Succeeded":
        raise Failed(f"{name} ended {final['phase']}: {json.dumps(final.get('conditions'))[:800]}")
    return final


def children(name: str) -> list[str]:
    selector = f"{contract.LABEL_JOB_NAME}={name}"
    found = []
    for kind in ("pods", "services", "configmaps", "jobs.batch"):
        found += [f"{kind}/{o['metadata']['name']}" for o in items(kind, NS, selector)]
    return found


def scenario_users_path(figures: Figures) -> None:
    """kubectl apply → the CRD's schema → the operator → pods bound by the scheduler → training → status
    → kubectl get dtr (the server's printer columns) → the engine Job (the Job controller's pod) →
    kubectl delete dtr → every child removed by the garbage collector."""
    name = "e2e-path"
    created = time.monotonic()
    apply(with_engine(small_job(name)))
    eventually(lambda: progress_step(name) > 0, f"{name}: training", 300)
    figures["create → training (s)"] = time.monotonic() - created
    nodes = {p["spec"].get("nodeName") for p in worker_pods(name)}
    if None in nodes or not nodes:
        raise Failed(f"workers not bound by the scheduler: {nodes}")
    final = finished(name)
    engine_jobs = items("jobs.batch", NS, f"{contract.LABEL_JOB_NAME}={name}")
    if not engine_jobs or not any(c["type"] == "Complete" and c["status"] == "True"
                                  for c in engine_jobs[0].get("status", {}).get("conditions", [])):
        raise Failed(f"the engine Job did not complete: {json.dumps(engine_jobs)[:500]}")
    artifacts = final.get("artifacts") or {}
    if not str(artifacts.get("onnx", "")).endswith("model.onnx"):
        raise Failed(f"no model.onnx in status.artifacts: {artifacts}")
    table = kubectl("get", "dtr", name, "-n", NS).stdout
    if "Succeeded" not in table or "PHASE" not in table:
        raise Failed(f"kubectl get dtr shows:\n{table}")
    print(table, end="")
    print(f"workers on {sorted(nodes)}; engine Job {engine_jobs[0]['metadata']['name']} Complete")
    kubectl("delete", "dtr", name, "-n", NS, "--wait=true", "--timeout=120s")
    eventually(lambda: not children(name), f"{name}: the garbage collector removing every child", 120)


def scenario_worker_killed(figures: Figures) -> None:
    name = "e2e-kill"
    apply(small_job(name))
    eventually(lambda: progress_step(name) >= 10, f"{name}: step 10 reported", 300)
    victim = next(p for p in worker_pods(name) if p["metadata"]["name"] == f"{name}-1")
    pids = trainer_pids(victim)
    if not pids:
        raise Failed(f"no trainer process found in pod {name}-1")
    kill(pids)
    killed = time.monotonic()
    eventually(lambda: status(name).get("restarts") == 1, f"{name}: a gang restart", 120)
    before = (status(name).get("progress") or {}).get("updatedAt")
    eventually(lambda: (status(name).get("progress") or {}).get("updatedAt") != before
               and status(name).get("phase") == "Running", f"{name}: training again", 300)
    figures["worker killed → training again (s)"] = time.monotonic() - killed
    logs = kubectl("logs", f"{name}-0", "-n", NS).stdout
    if not re.search(r"resumed from \S+ at step \d+", logs):
        raise Failed(f"{name}-0 did not resume from a checkpoint:\n{logs[-1500:]}")
    final = finished(name)
    if final["restarts"] != 1:
        raise Failed(f"restarts {final['restarts']}, expected 1")
    kubectl("delete", "dtr", name, "-n", NS, "--wait=false")


def _refused(result, *fragments: str) -> None:
    text = result.stderr + result.stdout
    if result.returncode == 0 or not all(f in text for f in fragments):
        raise Failed(f"expected a refusal naming {fragments}, got rc {result.returncode}: {text.strip()[:600]}")


def scenario_forged_record(figures: Figures) -> None:
    """A user's own credentials: the operator's record cannot be written, set or removed at the API."""
    alice = user_kubeconfig("alice@example.com")
    kubectl("create", "role", "dtr-editor", "-n", NS, "--verb=get,list,watch,create,update,patch,delete",
            "--resource=distributedtrainings.dtrain.dev", check=False)
    kubectl("create", "rolebinding", "alice-dtr-editor", "-n", NS, "--role=dtr-editor", "--user=alice@example.com",
            check=False)
    job = small_job("e2e-forged")
    accepted = {**job["spec"], "hostNetwork": True, "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}
    forged = copy.deepcopy(job)
    forged["metadata"]["annotations"] = {contract.ANNOTATION_STATE: json.dumps(
        {"version": 2, "signature": "0" * 64, "restarts": 0, "acceptedSpec": accepted})}
    _refused(apply(forged, kubeconfig=alice, check=False), "dtrain.dev/ annotations are written only by the dtrain operator")
    job["spec"]["runPolicy"]["suspend"] = True  # nothing to run: only its metadata matters here
    job["metadata"]["annotations"] = {contract.ANNOTATION_MEMORY_ESTIMATE: '{"fits": true}'}
    apply(job, kubeconfig=alice)  # the annotation users own passes
    eventually(lambda: contract.ANNOTATION_STATE in (get("dtr", "e2e-forged", NS)["metadata"].get("annotations") or {}),
               "the operator's own record on the job", 60)
    record = get("dtr", "e2e-forged", NS)["metadata"]["annotations"][contract.ANNOTATION_STATE]
    patch = json.dumps({"metadata": {"annotations": {contract.ANNOTATION_STATE: record.replace('"restarts":0', '"restarts":9')}}})
    _refused(kubectl("patch", "dtr", "e2e-forged", "-n", NS, "--type=merge", "-p", patch, kubeconfig=alice, check=False),
             "may not be set or changed")
    removal = json.dumps({"metadata": {"annotations": {contract.ANNOTATION_STATE: None}}})
    _refused(kubectl("patch", "dtr", "e2e-forged", "-n", NS, "--type=merge", "-p", removal, kubeconfig=alice, check=False),
             "may not be removed")
    if [p for p in worker_pods("e2e-forged") if p["spec"].get("hostNetwork")]:
        raise Failed("a pod with host access exists")
    kubectl("delete", "dtr", "e2e-forged", "-n", NS, "--wait=false", kubeconfig=alice)


def scenario_tokens(figures: Figures) -> None:
    """The trainer's token (bound to rank 0's pod) and the operator's, as the API server judges them."""
    name = "e2e-tokens"
    apply(small_job(name, trainer={**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": 40}))
    eventually(lambda: len([p for p in worker_pods(name) if p["status"].get("phase") == "Running"]) == 2,
               f"{name}: two Running workers", 300)
    token = kubectl("create", "token", "dtrain-trainer", "-n", NS, "--bound-object-kind=Pod",
                    f"--bound-object-name={name}-0").stdout.strip()
    trainer = token_kubeconfig("trainer", token)

    def status_patch(job: str, body: dict[str, Any]) -> tuple[int, str]:
        path = f"/apis/{contract.API_VERSION}/namespaces/{NS}/{contract.PLURAL}/{job}/status"
        return request_with_token(token, "PATCH", path, {"status": body})

    code, text = status_patch(name, {"progress": {"step": 1}})
    if code != 200:
        raise Failed(f"the trainer's token could not report progress: {code} {text[:300]}")
    code, text = status_patch(name, {"phase": "Succeeded"})
    if code != 403 or "a trainer may change only status.progress" not in text:
        raise Failed(f"the trainer's token changed the phase: {code} {text[:300]}")
    code, text = status_patch("e2e-other", {"progress": {"step": 1}})
    if code not in (403, 404):
        raise Failed(f"the trainer's token reached another job's status: {code} {text[:300]}")
    for verb, resource in (("get", "secrets"), ("create", "pods"), ("patch", "distributedtrainings.dtrain.dev")):
        allowed = kubectl("auth", "can-i", verb, resource, "-n", NS, kubeconfig=trainer, check=False).stdout.strip()
        if allowed != "no":
            raise Failed(f"the trainer's token may {verb} {resource}")
    operator = "system:serviceaccount:dtrain-system:dtrain-operator"
    checks: list[tuple[str, str, str, str]] = [
        ("yes", "create", "pods", NS), ("yes", "patch", "distributedtrainings.dtrain.dev/status", NS),
        ("no", "get", "secrets", NS), ("no", "get", "secrets", "kube-system"), ("no", "create", "clusterrolebindings", NS),
        ("yes", "get", "secrets/dtrain-operator-state-key", "dtrain-system"),
    ]
    for expected, verb, resource, namespace in checks:
        answer = kubectl("auth", "can-i", verb, resource, "-n", namespace, f"--as={operator}", check=False).stdout.strip()
        if answer != expected:
            raise Failed(f"the operator may {verb} {resource} in {namespace}: {answer}, expected {expected}")
    kubectl("delete", "dtr", name, "-n", NS, "--wait=false")


# What the CRD itself refuses at `kubectl apply` (its schema and CEL rules), with the server's own message.
CRD_REFUSALS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("nodes 0", lambda s: s.update(nodes=0), "spec.nodes"),
    ("an unknown accelerator", lambda s: s.update(accelerator="tpu"), "spec.accelerator"),
    ("a relative checkpoint dir", lambda s: s["checkpoint"].update(dir="checkpoints"), "spec.checkpoint.dir"),
    ("minBatch above maxBatch", lambda s: s.update(engine={"minBatch": 8, "maxBatch": 2}), "minBatch <= optBatch <= maxBatch"),
    ("a reserved env name", lambda s: s.update(env=[{"name": "PET_NNODES", "value": "9"}]), "spec.env"),
    # Two nodes and pod-local directories: checkpoints the gang cannot share (docs/storage.md).
    ("no shared storage", lambda s: [s.pop("storage"), s.pop("checkpoint"), s.pop("artifacts")],
     "needs shared storage"),
]


def scenario_crd_refusals(figures: Figures) -> None:
    for title, change, fragment in CRD_REFUSALS:
        job = small_job("e2e-refused")
        change(job["spec"])
        result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(job), check=False)
        if result.returncode == 0 or fragment not in result.stderr:
            raise Failed(f"{title}: expected the API server to refuse it naming {fragment!r}: {result.stderr.strip()[:400]}")
        print(f"refused at kubectl apply: {title}: {result.stderr.strip().splitlines()[0][:160]}")


SCENARIOS: list[tuple[str, str, Callable[[Figures], None]]] = [
    ("crd-refusals", "what the CRD refuses at kubectl apply, with the API server's own message", scenario_crd_refusals),
    ("forged-record", "the operator's record: refused at the API with a user's own credentials", scenario_forged_record),
    ("users-path", "kubectl apply → training → engine Job → kubectl delete (garbage collection)", scenario_users_path),
    ("worker-kill", "worker SIGKILL → gang restart → resume at the checkpoint", scenario_worker_killed),
    ("tokens", "the trainer's and the operator's tokens, as RBAC and the admission policies judge them", scenario_tokens),
]
