"""The e2e cluster and what the scenarios share: the images, the small job as a user writes it, and
reading a job's progress, pods, events and conditions."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from typing import Any

import yaml
from localcluster import layout

from dtrain_operator.api import contract

from ..kube import (
    REPO,
    Failed,
    eventually,
    get,
    items,
    kubectl,
    status,
    worker_pods,
)

NS = layout.JOB_NAMESPACE
SMALL_JOB = REPO / "tests" / "cluster" / "small-job.yaml"
QUICKSTART = REPO / "examples" / "quickstart.yaml"
QUICKSTART_STEPS_VARIABLE = "E2E_QUICKSTART_MAX_STEPS"
TRAINING_TIMEOUT = 900.0
ENGINE_RESOURCES = {"limits": {"cpu": "1", "memory": "4Gi"}}
# The claim the README's walkthrough names, made by make cluster in the jobs' namespace.
CLAIM = layout.SHARED_CLAIM
README = REPO / "README.md"
TRAINER_IMAGE = f"{layout.IMAGE_REGISTRY}/dtrain-trainer:{layout.version()}"
ENGINE_IMAGE = f"{layout.IMAGE_REGISTRY}/dtrain-engine:{layout.version()}"
USER_IMAGE = f"{layout.IMAGE_REGISTRY}/e2e-lit-model:{layout.version()}"
Figures = dict[str, float]
# The cluster python -m tests.cluster starts: 2 nodes of one nvidia.com/gpu each (a count the scheduler
# checks; no device), so that a gang of 3 GPU workers does not fit until a third node joins.
E2E_NODES = 2
E2E_GPUS_PER_NODE = 1
GPU = "nvidia.com/gpu"


def e2e_cluster_arguments(scenarios: Iterable[str] = ()) -> list[str]:
    """`python -m localcluster up`'s arguments for the e2e cluster that runs `scenarios` (their keys): the
    second schedulers they need too (SCENARIO_SCHEDULERS)."""
    needed = sorted({SCENARIO_SCHEDULERS[key] for key in scenarios if key in SCENARIO_SCHEDULERS})
    return ["--nodes", str(E2E_NODES), "--gpus-per-node", str(E2E_GPUS_PER_NODE),
            *(["--schedulers", ",".join(needed)] if needed else [])]


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
                             "fallback": "onnxruntime", "resources": ENGINE_RESOURCES}
    return job


def progress_step(name: str) -> int:
    """The step in the job's status: the operator writes rank 0's progress at most every 10 s."""
    return int((status(name).get("progress") or {}).get("step") or 0)


LOGGED_STEP = re.compile(r"^dtrain: epoch \d+\s+step (\d+)", re.MULTILINE)


def logged_step(name: str) -> int:
    """The step rank 0 has logged (its progress lines): the clock of a disruption that must land mid-training,
    which the status, written at most every 10 s, is too coarse for in a job that trains for seconds."""
    logs = kubectl("logs", f"{name}-0", "-n", NS, check=False).stdout
    return max((int(step) for step in LOGGED_STEP.findall(logs)), default=0)


def finished(name: str, timeout: float = 600) -> dict[str, Any]:
    final = eventually(lambda: status(name).get("phase") in ("Succeeded", "Failed") and status(name),
                       f"{name} to finish", timeout)
    if final["phase"] != "Succeeded":
        raise Failed(f"{name} ended {final['phase']}: {json.dumps(final.get('conditions'))[:800]}")
    return final


def children(name: str) -> list[str]:
    selector = f"{contract.LABEL_JOB_NAME}={name}"
    found = []
    for kind in ("pods", "services", "jobs.batch"):
        found += [f"{kind}/{o['metadata']['name']}" for o in items(kind, NS, selector)]
    return found


def checkpoint_step(name: str) -> int:
    return int((status(name).get("lastCheckpoint") or {}).get("step") or 0)


def running_gang(name: str, nodes: int = 2, generation: int | None = None) -> list[dict[str, Any]] | None:
    pods = [p for p in worker_pods(name) if p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
            and (generation is None or p["metadata"]["labels"].get(contract.LABEL_GANG_GENERATION) == str(generation))]
    return pods if len(pods) == nodes else None


def pod(name: str) -> dict[str, Any]:
    found = get("pod", name, NS)
    if found is None:
        raise Failed(f"no pod {name}")
    return found


def events(name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in items("events", NS) if e["involvedObject"].get("name") == name and e["reason"] == reason]


def condition(name: str, kind: str) -> dict[str, Any]:
    return next((c for c in status(name).get("conditions") or [] if c["type"] == kind), {})


def delete(name: str) -> None:
    kubectl("delete", "dtr", name, "-n", NS, "--wait=false", check=False)


def operator_pods() -> list[dict[str, Any]]:
    return [p for p in items("pods", "dtrain-system", "app.kubernetes.io/name=dtrain-operator")
            if not p["metadata"].get("deletionTimestamp")]


def lease_holder() -> str:
    lease = get("lease", "dtrain-operator", "dtrain-system") or {}
    return (lease.get("spec") or {}).get("holderIdentity") or ""
# The second schedulers a scenario needs, which python -m tests.cluster starts the cluster with when it runs.
SCENARIO_SCHEDULERS = {"gang-coscheduling": "coscheduling"}
