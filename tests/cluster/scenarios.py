"""The scenarios on the real control plane: the user's path with kubectl, a worker killed, and what
the API server itself enforces (the CRD's rules, the chart's admission policies and RBAC, checked
with the users' and the pods' own credentials)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from localcluster import controlplane, layout, processes, schedulers

from dtrain_operator.api import contract
from dtrain_operator.core.child_names import COSCHEDULING_GROUP_LABEL
from tests.trainer.user_code.dtrain_test_user import trained_samples

from .kube import (
    REPO,
    Failed,
    apply,
    eventually,
    get,
    items,
    kill,
    kubectl,
    link,
    localcluster,
    pod_netns,
    pod_processes,
    request_with_token,
    status,
    throttle,
    trainer_pids,
    user_kubeconfig,
    worker_pods,
)
from .wrong_jobs import scenario_wrong_jobs

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


def walkthrough_commands(storage: str) -> str:
    """The shell lines of the README's "3. Submit." that make my-job.yaml, as a user runs them: with the
    claim's printf line (storage "claim"), or with the object-storage one uncommented instead ("s3")."""
    text = README.read_text()
    step = text[text.index("**3. Submit.**"):text.index("**4. Watch.**")]
    block = step.split("```", 2)[1]
    lines = []
    for line in block.splitlines():
        if line.startswith("dtrain submit"):
            continue  # the scenario applies the file itself, and checks it first
        if storage == "s3" and line.startswith("printf '  storage:\\n    claimName"):
            continue
        if storage == "s3" and line.startswith("#   printf"):
            line = line.removeprefix("#   ")
        lines.append(line)
    return "\n".join(lines)


def quickstart_job(storage: str = "claim") -> dict[str, Any]:
    """examples/quickstart.yaml completed by the README's own walkthrough commands (its images and storage
    line), run with bash; then what this cluster needs beyond a GPU cluster: the engine's ONNX Runtime
    fallback (no TensorRT here), and for "s3" the cluster's gateway and its Secret instead of the README's
    placeholders; maxSteps only when E2E_QUICKSTART_MAX_STEPS says so (a slow machine)."""
    with tempfile.TemporaryDirectory(prefix="dtrain-e2e-walkthrough-") as folder:
        Path(folder, "examples").symlink_to(REPO / "examples")
        ran = subprocess.run(["bash", "-euo", "pipefail", "-c", walkthrough_commands(storage)], cwd=folder, text=True,
                             capture_output=True, check=False, env={**os.environ, "REGISTRY": layout.IMAGE_REGISTRY})
        if ran.returncode != 0:
            raise Failed(f"the README's walkthrough commands failed ({ran.returncode}): {ran.stderr[-1500:]}")
        job = yaml.safe_load(Path(folder, "my-job.yaml").read_text())
    if (job["spec"].get("image"), job["spec"]["engine"].get("image")) != (TRAINER_IMAGE, ENGINE_IMAGE):
        raise Failed(f"the walkthrough's images are not the ones make cluster built: {job['spec']}")
    expected_storage = {"claimName": CLAIM} if storage == "claim" else {"url": "s3://my-bucket/dtrain",
                                                                       "credentialsSecret": "s3-creds"}
    if job["spec"].get("storage") != expected_storage:
        raise Failed(f"the walkthrough's storage line gave {job['spec'].get('storage')}, not {expected_storage}")
    if storage == "s3":
        job["metadata"]["name"] += "-s3"
        # A prefix of this run's own: a job of the same name in an earlier run's prefix is another job,
        # whose checkpoints the trainer rightly refuses (checkpoint.foreign).
        job["spec"]["storage"] = {"url": f"s3://{layout.S3_BUCKET}/e2e-{time.strftime('%H%M%S')}",
                                  "s3": {"endpoint": layout.S3_ENDPOINT}, "credentialsSecret": layout.S3_SECRET}
    job["metadata"]["namespace"] = NS
    job["spec"]["engine"].update(fallback="onnxruntime", resources=ENGINE_RESOURCES)
    if os.environ.get(QUICKSTART_STEPS_VARIABLE):
        job["spec"]["trainer"]["maxSteps"] = int(os.environ[QUICKSTART_STEPS_VARIABLE])
    return job


def apply_shipped_quickstart() -> str:
    """`kubectl -n team-a apply -f examples/quickstart.yaml`, the file unchanged: make cluster's job defaults give
    it the images, the namespace's claim and the engine's ONNX Runtime fallback (maxSteps only when
    E2E_QUICKSTART_MAX_STEPS says so, on a slow machine). Returns the job's name."""
    job = yaml.safe_load(QUICKSTART.read_text())
    if os.environ.get(QUICKSTART_STEPS_VARIABLE):
        job["spec"]["trainer"]["maxSteps"] = int(os.environ[QUICKSTART_STEPS_VARIABLE])
        kubectl("apply", "-n", NS, "-f", "-", stdin=json.dumps(job))
    else:
        kubectl("apply", "-n", NS, "-f", str(QUICKSTART))
    return str(job["metadata"]["name"])


def scenario_quickstart(figures: Figures) -> None:
    """kubectl apply of the shipped quick start into the jobs' namespace → the CRD's schema → the operator (the
    cluster's job defaults) → pods bound by the scheduler → training → status → kubectl get dtr (the server's
    printer columns) → the engine Job (the Job controller's pod) → kubectl delete dtr → every child removed by the
    garbage collector; then the same file with dtrain run."""
    created = time.monotonic()
    name = apply_shipped_quickstart()
    eventually(lambda: len([p for p in worker_pods(name) if p["status"].get("phase") == "Running"]) == 2,
               f"{name}: both workers Running", 300)
    figures["create → all pods Running (s)"] = time.monotonic() - created
    eventually(lambda: progress_step(name) > 0, f"{name}: the first training step", 300)
    figures["create → first training step (s)"] = time.monotonic() - created
    nodes = {p["spec"].get("nodeName") for p in worker_pods(name)}
    if None in nodes or not nodes:
        raise Failed(f"workers not bound by the scheduler: {nodes}")
    if pods_from_images():
        # Each container's root is its image's (a buildah working container), not this machine's.
        roots = {p["metadata"]["name"]: container_root(p) for p in worker_pods(name)}
        if not all(root.startswith("/var/lib/containers/") for root in roots.values()):
            raise Failed(f"a worker's container is not rooted in its image: {roots}")
    while_running = kubectl("get", "dtr", name, "-n", NS, "--no-headers").stdout.split()
    final = finished(name, TRAINING_TIMEOUT)
    figures["quick start through the operator (s)"] = time.monotonic() - created
    accepted = final.get("acceptedSpec") or {}
    if (accepted.get("image"), (accepted.get("storage") or {}).get("claimName")) != (TRAINER_IMAGE, CLAIM):
        raise Failed(f"status.acceptedSpec does not show the job defaults it ran with: {json.dumps(accepted)[:600]}")
    engine_jobs = items("jobs.batch", NS, f"{contract.LABEL_JOB_NAME}={name}")
    if not engine_jobs or not any(c["type"] == "Complete" and c["status"] == "True"
                                  for c in engine_jobs[0].get("status", {}).get("conditions", [])):
        raise Failed(f"the engine Job did not complete: {json.dumps(engine_jobs)[:500]}")
    claim = layout.VOLUMES / NS / CLAIM / NS / name / "artifacts"  # the per-job default under the claim
    for artifact in (contract.ONNX_FILE_NAME, contract.ENGINE_REPORT_FILE_NAME):
        if not (claim / artifact).is_file() or artifact not in json.dumps(final.get("artifacts") or {}):
            raise Failed(f"{artifact} is not on the claim ({claim}) and in status.artifacts: {final.get('artifacts')}")
    if json.loads((claim / contract.ENGINE_REPORT_FILE_NAME).read_text()).get("engine") is not None:
        raise Failed("no TensorRT here: the fallback writes no engine")
    table = kubectl("get", "dtr", name, "-n", NS).stdout
    print(table, end="")
    print(f"while Running: {while_running}; workers on {sorted(nodes)}; engine Job "
          f"{engine_jobs[0]['metadata']['name']} Complete")
    kubectl("delete", "dtr", name, "-n", NS, "--wait=true", "--timeout=120s")
    eventually(lambda: not children(name), f"{name}: the garbage collector removing every child", 120)
    # The same file on this machine with dtrain run, measured in the same run.
    local = yaml.safe_load(QUICKSTART.read_text())
    if os.environ.get(QUICKSTART_STEPS_VARIABLE):
        local["spec"]["trainer"]["maxSteps"] = int(os.environ[QUICKSTART_STEPS_VARIABLE])
    with tempfile.TemporaryDirectory(prefix="dtrain-e2e-run-") as folder:
        path = Path(folder) / "quickstart.yaml"
        path.write_text(yaml.safe_dump(local))
        start = time.monotonic()
        result = subprocess.run([str(Path(sys.executable).parent / "dtrain"), "run", str(path), "--workdir",
                                 str(Path(folder) / "run")], capture_output=True, text=True, check=False,
                                timeout=TRAINING_TIMEOUT)
        if result.returncode != 0:
            raise Failed(f"dtrain run failed ({result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}")
        figures["quick start with dtrain run (s)"] = time.monotonic() - start


def kill_rank_1(name: str) -> float:
    """SIGKILL to rank 1's training process (its pod and supervisor stay); returns the kill's time."""
    victim = next(p for p in worker_pods(name) if p["metadata"]["name"] == f"{name}-1")
    pids = trainer_pids(victim)
    if not pids:
        raise Failed(f"no trainer process found in pod {name}-1")
    kill(pids)
    return time.monotonic()


def kill_rank_1_and_await_restart(name: str) -> float:
    """SIGKILL to rank 1's training process; returns when the operator has restarted the gang (the kill's time)."""
    killed = kill_rank_1(name)
    eventually(lambda: status(name).get("restarts") == 1, f"{name}: a gang restart", 120)
    return killed


@dataclass
class RestartMeasure:
    """One worker-process kill, measured: until the new gang trains, the steps it trained again, the pods."""

    strategy: str
    seconds: float
    steps_lost: int
    resumed_at: int
    same_pods: bool
    status: dict[str, Any]


def measure_restart(strategy: str) -> RestartMeasure:
    """A job with runPolicy.restartStrategy `strategy`: rank 1's training process SIGKILLed mid-epoch (the pods and
    nodes stay) → the first progress of the next gang. Steps lost: the highest step the first gang reported (its
    surviving rank's checkpoint included) less the step the second resumed from, as `dtrain run` counts them."""
    name = f"e2e-restart-{strategy.lower()}"
    # An earlier run's checkpoints on a kept cluster's claim are another job's (the trainer refuses them).
    shutil.rmtree(layout.VOLUMES / NS / CLAIM / name, ignore_errors=True)
    # 4 epochs of 6 steps; killed just after the first epoch's end is reported (at step 6): mid-epoch.
    trainer = {**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": 4}
    apply(small_job(name, trainer=trainer, runPolicy={"backoffLimit": 3, "restartStrategy": strategy}))
    eventually(lambda: progress_step(name) >= 6, f"{name}: step 6 reported", 300)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in worker_pods(name)}
    killed = kill_rank_1(name)
    reached = 0

    def training_again() -> bool:
        nonlocal reached
        now = status(name)
        progress, saved = now.get("progress") or {}, now.get("lastCheckpoint") or {}
        if progress.get("gangGeneration") == 0:
            reached = max(reached, int(progress.get("step") or 0))
        if saved.get("step") and now.get("phase") == "Restarting":  # the surviving rank's, not the new gang's
            reached = max(reached, int(saved["step"]))
        return progress.get("gangGeneration") == 1 and progress.get("stage") == "training"

    eventually(training_again, f"{name}: the gang training again after the kill", 300, every=0.25)
    seconds = time.monotonic() - killed
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in worker_pods(name) if not p["metadata"].get("deletionTimestamp")}
    logs = kubectl("logs", f"{name}-0", "-n", NS).stdout
    resumed = [int(step) for step in re.findall(r"resumed from \S+ at step (\d+)", logs)]
    if not resumed:
        raise Failed(f"{name}-0 did not resume from a checkpoint:\n{logs[-1500:]}")
    final = finished(name)
    delete(name)
    return RestartMeasure(strategy, seconds, max(0, reached - resumed[-1]), resumed[-1], after == before, final)


def scenario_in_place_restart(figures: Figures) -> None:
    """The same kill of a training process under restartStrategy InPlace and Recreate: in place, the supervisors
    run torchrun again in the same pods (same UIDs, no scheduling, no image, no volume), counted as a gang restart;
    by recreate, new pods. Both resume exactly where the surviving rank saved (steps lost 0)."""
    in_place, recreate = measure_restart("InPlace"), measure_restart("Recreate")
    for measured, same in ((in_place, True), (recreate, False)):
        final = measured.status
        if final.get("phase") != "Succeeded" or final.get("restarts") != 1:
            raise Failed(f"{measured.strategy}: {final.get('phase')} after {final.get('restarts')} restart(s)")
        restart = final.get("lastRestart") or {}
        if restart.get("strategy") != measured.strategy or final.get("restartsInPlace", 0) != int(same):
            raise Failed(f"{measured.strategy}: lastRestart {restart}, restartsInPlace {final.get('restartsInPlace')}")
        if measured.same_pods != same:
            raise Failed(f"{measured.strategy}: the pods {'changed' if same else 'stayed'}")
        reason = "RestartInPlace" if same else "RestartByRecreate"
        if not events(f"e2e-restart-{measured.strategy.lower()}", reason):
            raise Failed(f"{measured.strategy}: no {reason} Event")
    figures["worker process killed → training again, in place (s)"] = in_place.seconds
    figures["worker process killed → training again, by recreate (s)"] = recreate.seconds
    figures["in place / recreate (ratio)"] = in_place.seconds / recreate.seconds
    figures["steps lost, in place"] = in_place.steps_lost
    figures["steps lost, by recreate"] = recreate.steps_lost
    print(f"in place: {in_place.seconds:.1f} s, resumed at step {in_place.resumed_at}, steps lost {in_place.steps_lost}; "
          f"by recreate: {recreate.seconds:.1f} s, resumed at step {recreate.resumed_at}, steps lost {recreate.steps_lost}")
    if in_place.steps_lost or recreate.steps_lost:
        raise Failed(f"steps lost: in place {in_place.steps_lost}, by recreate {recreate.steps_lost} (a rank survived)")


def scenario_object_storage(figures: Figures) -> None:
    """The quick start with the README's s3:// line, on make cluster's S3 gateway: a worker SIGKILLed mid-epoch
    → the gang resumes from the bucket's checkpoint → the engine Job reads model.onnx from the bucket and
    writes its report there; the status names the URLs."""
    job = quickstart_job("s3")
    name = job["metadata"]["name"]
    url = f"{job['spec']['storage']['url']}/{NS}/{name}"  # the per-job default under spec.storage.url
    # The gateway keeps each object as a file under its bucket's folder.
    prefix = layout.OBJECTS / url.removeprefix("s3://")
    apply(job)
    eventually(lambda: checkpoint_step(name) > 0, f"{name}: a checkpoint in the bucket", 600)
    saved = status(name)["lastCheckpoint"]
    if not str(saved.get("path", "")).startswith(f"{url}/checkpoints/"):
        raise Failed(f"status.lastCheckpoint is not in the bucket: {saved}")
    killed = kill_rank_1_and_await_restart(name)
    final = finished(name, TRAINING_TIMEOUT)
    figures["s3: worker killed → Succeeded (s)"] = time.monotonic() - killed
    logs = kubectl("logs", f"{name}-0", "-n", NS).stdout
    resumed = re.search(rf"resumed from {re.escape(url)}/checkpoints/(\S+) at step (\d+)", logs)
    if not resumed or int(resumed.group(2)) < saved["step"]:
        raise Failed(f"{name}-0 did not resume from the bucket's checkpoint (step >= {saved['step']}):\n{logs[-1500:]}")
    for leaf in ("checkpoints/" + contract.LAST_POINTER_FILE_NAME, "artifacts/" + contract.ONNX_FILE_NAME,
                 "artifacts/" + contract.ENGINE_REPORT_FILE_NAME):
        if not (prefix / leaf).is_file():
            raise Failed(f"{leaf} is not in the bucket (the gateway's {prefix})")
    if f"{url}/artifacts/" not in json.dumps(final.get("artifacts") or {}):
        raise Failed(f"status.artifacts does not name the bucket: {final.get('artifacts')}")
    print(f"resumed from {resumed.group(1)} at step {resumed.group(2)}; model.onnx and the engine report in the bucket")
    kubectl("delete", "dtr", name, "-n", NS, "--wait=false")


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


def scenario_network_cut(figures: Figures) -> None:
    name = "e2e-netcut"
    job = small_job(name)
    timeout = job["spec"]["nccl"]["timeoutSeconds"]
    apply(job)
    eventually(lambda: checkpoint_step(name) >= 8, f"{name}: a checkpoint at step 8 or later", 300)
    link(pod(f"{name}-1"), up=False)
    cut = time.monotonic()
    eventually(lambda: status(name).get("restarts") == 1, f"{name}: a gang restart after the cut", timeout + 60)
    eventually(lambda: running_gang(name, generation=1), f"{name}: the new gang Running", 120)
    elapsed = time.monotonic() - cut
    final = finished(name)
    # A collective times out after timeoutSeconds, the pod fails and the operator replaces the gang;
    # the kubelet's SIGTERM-to-exit and the new pods' start come on top.
    if elapsed > timeout + 60:
        raise Failed(f"the gang took {elapsed:.0f} s to restart after the cut (timeout {timeout} s)")
    if final["restarts"] != 1:
        raise Failed(f"restarts {final['restarts']}, expected 1")
    figures["network cut → gang restarted (s)"] = elapsed
    delete(name)


def scenario_hang(figures: Figures) -> None:
    """A link cut with a long collective timeout: the progress deadline restarts the gang, not the timeout."""
    name = "e2e-hang"
    job = small_job(name)
    job["spec"]["nccl"]["timeoutSeconds"] = 600
    job["spec"]["runPolicy"]["progressDeadlineSeconds"] = 30
    apply(job)
    eventually(lambda: checkpoint_step(name) >= 8, f"{name}: a checkpoint at step 8 or later", 300)
    link(pod(f"{name}-1"), up=False)
    cut = time.monotonic()
    eventually(lambda: status(name).get("restarts") == 1, f"{name}: a gang restart after the hang", 150)
    decided = time.monotonic()
    restarting = condition(name, "Restarting")
    eventually(lambda: running_gang(name, generation=1), f"{name}: the new gang Running", 120)
    restarted = time.monotonic()
    final = finished(name)
    if restarting.get("reason") != "ProgressDeadlineExceeded":
        raise Failed(f"restarted for {restarting}")
    if final["restarts"] != 1:
        raise Failed(f"restarts {final['restarts']}, expected 1")
    figures["hang (link cut) → restart decided (s), collective timeout 600 s"] = decided - cut
    figures["hang (link cut) → new gang running (s)"] = restarted - cut
    delete(name)


def scenario_straggler(figures: Figures) -> None:
    """One pod's link slowed (tc tbf on its eth0): the Straggler condition and Warning Event name that pod."""
    name, slowed = "e2e-slow", "e2e-slow-1"
    # Three ranks: a rank's link time is its two ring neighbours' fetches from it, so a slow one stands out.
    apply(small_job(name, nodes=3, stragglers={"everyNSteps": 2, "factor": 1.5, "window": 3}))
    eventually(lambda: progress_step(name) >= 8, f"{name}: training", 300)
    if events(name, "Straggler"):
        raise Failed(f"a straggler named before any link was slowed: {events(name, 'Straggler')}")
    victim = pod(slowed)
    throttle(victim, 1000)
    applied = time.monotonic()
    event = eventually(lambda: next(iter(events(name, "Straggler")), None), f"{name}: a Straggler Warning Event", 180)
    figures["link slowed (to 1000 Mbit/s) → straggler Event (s)"] = time.monotonic() - applied
    message = event["message"]
    if event["type"] != "Warning" or f"(pod {slowed} on node {victim['spec']['nodeName']})" not in message:
        raise Failed(f"the Event does not name {slowed} and its node: {message}")
    if any(other in message for other in (f"{name}-0", f"{name}-2")) or "its link time" not in message:
        raise Failed(f"the Event names another pod, or not the link: {message}")
    if f"pod {slowed} " not in condition(name, "Straggler").get("message", ""):
        raise Failed(f"the Straggler condition: {condition(name, 'Straggler')}")
    delete(name)


def scenario_wrong_interface(figures: Figures) -> None:
    """nccl.socketIfname names an interface the pods lack: the job fails in pre-flight, not in a hang."""
    name = "e2e-iface"
    job = small_job(name)
    job["spec"]["nccl"]["socketIfname"] = "ens9f7"
    apply(job)
    eventually(lambda: running_gang(name, generation=0), f"{name}: the gang Running", 300)
    running = time.monotonic()
    final = eventually(lambda: status(name).get("phase") in ("Succeeded", "Failed") and status(name), f"{name} finished", 120)
    failed = next(c for c in final["conditions"] if c["type"] == "Failed") if final["phase"] == "Failed" else {}
    if failed.get("reason") != "InvalidTrainerConfig" or "NCCL_SOCKET_IFNAME=ens9f7" not in failed.get("message", ""):
        raise Failed(f"expected InvalidTrainerConfig naming NCCL_SOCKET_IFNAME=ens9f7: {final}")
    if final["restarts"] != 0:
        raise Failed(f"restarts {final['restarts']}")
    figures["wrong interface → job failed, from Running (s)"] = time.monotonic() - running
    delete(name)


def operator_pods() -> list[dict[str, Any]]:
    return [p for p in items("pods", "dtrain-system", "app.kubernetes.io/name=dtrain-operator")
            if not p["metadata"].get("deletionTimestamp")]


def lease_holder() -> str:
    lease = get("lease", "dtrain-operator", "dtrain-system") or {}
    return (lease.get("spec") or {}).get("holderIdentity") or ""


def scenario_operator_killed(figures: Figures) -> None:
    """The operator's process SIGKILLed mid-training: its container restarts (the kubelet), nothing is created twice."""
    name = "e2e-opkill"
    apply(small_job(name))
    eventually(lambda: progress_step(name) >= 4, f"{name}: training", 300)
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in worker_pods(name)}
    (operator,) = operator_pods()
    kill(pod_processes(operator))
    killed = time.monotonic()
    step_while_down = progress_step(name)
    eventually(lambda: (o := operator_pods()) and o[0]["status"]["containerStatuses"][0]["restartCount"] >= 1
               and o[0]["status"]["containerStatuses"][0]["ready"], "the operator's container restarted and ready", 180)
    figures["operator killed → its container ready again (s)"] = time.monotonic() - killed
    final = finished(name)
    if final["restarts"] != 0:
        raise Failed(f"a restart after the operator's restart: {final['restarts']}")
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in worker_pods(name)}
    if any(after.get(n, uid) != uid for n, uid in uids.items()):
        raise Failed(f"a worker pod was created again: {uids} → {after}")
    if (final.get("progress") or {}).get("step", 0) <= step_while_down:
        raise Failed("no progress after the operator came back")
    delete(name)


def scenario_suspend_resume(figures: Figures) -> None:
    name = "e2e-suspend"
    apply(small_job(name))
    eventually(lambda: checkpoint_step(name) >= 8, f"{name}: a checkpoint at step 8 or later", 300)
    kubectl("patch", "dtr", name, "-n", NS, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}')
    suspended = time.monotonic()
    eventually(lambda: status(name).get("phase") == "Suspended", f"{name} Suspended", 60)
    eventually(lambda: not worker_pods(name), f"{name}: every worker pod gone", 90)
    figures["suspend → every pod gone (s)"] = time.monotonic() - suspended
    kept = checkpoint_step(name)
    kubectl("patch", "dtr", name, "-n", NS, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":false}}}')
    logs = eventually(lambda: (text := kubectl("logs", f"{name}-0", "-n", NS, check=False).stdout)
                      and "resumed from" in text and text, f"{name}: resumed", 300)
    resumed = int(re.search(r"resumed from \S+ at step (\d+)", logs).group(1))
    if resumed != kept:
        raise Failed(f"resumed at step {resumed}, the last checkpoint was at step {kept}")
    finished(name)
    delete(name)


def scenario_delete(figures: Figures) -> None:
    name = "e2e-delete"
    apply(small_job(name))
    eventually(lambda: progress_step(name) >= 2, f"{name}: training", 300)
    pods = worker_pods(name)
    pids = [pid for p in pods for pid in pod_processes(p)]
    namespaces = {pod_netns(p) for p in pods}
    if not pids:
        raise Failed("no processes to stop")
    kubectl("delete", "dtr", name, "-n", NS, "--wait=false")
    deleted = time.monotonic()
    eventually(lambda: not [p for p in pids if Path(f"/proc/{p}").exists()], f"{name}: every process gone", 60)
    figures["job deleted → every process gone (s)"] = time.monotonic() - deleted
    eventually(lambda: not (namespaces & set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
                                            .stdout.split())), f"{name}: the pods' network namespaces removed", 30)
    eventually(lambda: get("dtr", name, NS) is None and not children(name), f"{name}: the job and its children gone", 60)


def scenario_engine_backoff(figures: Figures) -> None:
    """An engine build that fails (int8 needs a quantized model): the Job controller retries backoffLimit
    times, the Job fails with BackoffLimitExceeded, the DistributedTraining fails with the engine's message."""
    name = "e2e-engine"
    job = with_engine(small_job(name, trainer={**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": 1}))
    job["spec"]["engine"].update(precision="int8", maxBatch=4, backoffLimit=1)
    apply(job)
    final = eventually(lambda: status(name).get("phase") in ("Succeeded", "Failed") and status(name), f"{name} finished",
                       TRAINING_TIMEOUT)
    if final["phase"] != "Failed" or "int8" not in json.dumps(final.get("conditions")):
        raise Failed(f"expected Failed with the engine's message: {json.dumps(final)[:800]}")
    (engine_job,) = items("jobs.batch", NS, f"{contract.LABEL_JOB_NAME}={name}")
    reasons = {c["type"]: c.get("reason") for c in engine_job["status"].get("conditions") or []}
    if reasons.get("Failed") != "BackoffLimitExceeded":
        raise Failed(f"the engine Job: {reasons}")
    attempts = items("pods", NS, f"{contract.LABEL_JOB_NAME}={name},{contract.LABEL_ROLE}={contract.ROLE_ENGINE}")
    if len(attempts) != 2:
        raise Failed(f"backoffLimit 1 means 2 attempts, saw {len(attempts)}")
    delete(name)


def helm_upgrade(*values: str) -> None:
    result = subprocess.run([str(REPO / ".tools" / "bin" / "helm"), f"--kubeconfig={layout.KUBECONFIG}", "upgrade",
                             "dtrain", str(REPO / "helm" / "dtrain-operator"), "-n", "dtrain-system", "--reuse-values",
                             *[f"--set={v}" for v in values], "--wait", "--timeout=5m"],
                            capture_output=True, text=True, check=False, timeout=400)
    if result.returncode != 0:
        raise Failed(f"helm upgrade {values}: {result.stderr.strip()}")


def scenario_leader_failover(figures: Figures) -> None:
    """Two operator replicas on real Leases: the leader's pod force-deleted (its node lost: no goodbye, and
    no restart of its container, which would take its own Lease back at once), the standby takes over
    when the Lease expires, and the job goes on without a restart."""
    name = "e2e-failover"
    helm_upgrade("replicas=2")
    try:
        eventually(lambda: len([p for p in operator_pods() if p["status"].get("containerStatuses", [{}])[0].get("ready")])
                   == 2, "two ready operator replicas", 180)
        apply(small_job(name))
        eventually(lambda: progress_step(name) >= 4, f"{name}: training", 300)
        leader = lease_holder()
        kubectl("delete", "pod", leader, "-n", "dtrain-system", "--grace-period=0", "--force")
        killed = time.monotonic()
        eventually(lambda: lease_holder() not in ("", leader), "another replica holding the Lease", 120, every=0.2)
        figures["operator leader's pod lost → the standby leads (s)"] = time.monotonic() - killed
        # Rank 0's reports find the new leader (the old one's address is gone, the standby's 503 passed).
        step = progress_step(name)
        reported = eventually(lambda: progress_step(name) > step or status(name, NS).get("phase") == "Succeeded",
                              f"{name}: progress written by the new leader", 300, every=0.2)
        if reported and progress_step(name) > step:
            figures["operator leader's pod lost → progress in the status again (s)"] = time.monotonic() - killed
        final = finished(name)
        if final["restarts"] != 0:
            raise Failed(f"a restart across the failover: {final['restarts']}")
    finally:
        helm_upgrade("replicas=1")
        delete(name)


def stop_and_start(component: str, seconds: float) -> None:
    processes.stop(component)
    time.sleep(seconds)
    {"kube-apiserver": controlplane.start_apiserver, "etcd": controlplane.start_etcd}[component]()


def scenario_control_plane_outage(figures: Figures) -> None:
    """kube-apiserver, then etcd, stopped for 20 s each during training and started again: training goes
    on, the operator and the kubelets resynchronise, no restart is spent, nothing is lost, and the operator rides
    the outages out (it stands down and leads again: its container is not restarted)."""
    name = "e2e-outage"
    apply(small_job(name, trainer={**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": 80}))
    eventually(lambda: progress_step(name) >= 4, f"{name}: training", 300)
    operator_restarts = operator_pods()[0]["status"]["containerStatuses"][0]["restartCount"]
    for component in ("kube-apiserver", "etcd"):
        before = progress_step(name)
        stopped = time.monotonic()
        stop_and_start(component, 20)
        eventually(lambda before=before: progress_step(name) > before + 2,
                   f"{name}: progress reported again after {component}", 180)
        figures[f"{component} stopped 20 s → progress reported again (s, from the stop)"] = time.monotonic() - stopped
    # Not waited to its end: how long 80 epochs take depends on the machine's load, not on the outages.
    after = status(name)
    if after.get("phase") != "Running" or after.get("restarts"):
        raise Failed(f"after the outages: phase {after.get('phase')}, {after.get('restarts')} restarts spent")
    restarted = operator_pods()[0]["status"]["containerStatuses"][0]["restartCount"] - operator_restarts
    if restarted:
        raise Failed(f"the operator's container was restarted {restarted} time(s) during the outages")
    delete(name)


BACK_TO_BACK_JOBS = 12
BACK_TO_BACK_SECONDS = 240.0


def scenario_back_to_back(figures: Figures) -> None:
    """A dozen short 2-node jobs, two at a time: each reaches Succeeded within a bound, none restarts, and no
    supervisor starts torchrun again after its rank finished (read from every pod's log): a finished gang is
    never started again (dtrain_trainer.supervisor.step)."""
    trainer = {**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": 1, "maxSteps": 4}
    names = [f"e2e-b2b-{i}" for i in range(BACK_TO_BACK_JOBS)]
    slowest = 0.0
    for pair in zip(names[::2], names[1::2]):
        started = time.monotonic()
        for name in pair:
            apply(small_job(name, trainer=trainer))
        for name in pair:
            final = finished(name, BACK_TO_BACK_SECONDS)
            if final.get("restarts"):
                raise Failed(f"{name}: {final['restarts']} restart(s)")
            for worker in worker_pods(name):
                log = kubectl("logs", worker["metadata"]["name"], "-n", NS, check=False).stdout
                starts = log.count("dtrain supervisor: starting torchrun")
                if starts > 1:
                    raise Failed(f"{worker['metadata']['name']}: torchrun started {starts} times:\n{log[-1500:]}")
        slowest = max(slowest, time.monotonic() - started)
        for name in pair:
            delete(name)
    figures["back to back: slowest pair of 2-node jobs, create → Succeeded (s)"] = slowest


def pods_from_images() -> bool:
    return json.loads(layout.CONFIG.read_text()).get("podsFrom") == "images"


def container_root(target: dict[str, Any]) -> str:
    """The root directory the pod's container process sees, on the machine's side (/proc/PID/root)."""
    for pid in pod_processes(target):  # unshare; its child is the container's PID 1
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return os.readlink(f"/proc/{children[0]}/root")
    return ""


def scenario_user_image(figures: Figures) -> None:
    """The README's way to bring one's own model: an image FROM the trainer image (examples/Containerfile),
    a job naming it and the class; it trains to Succeeded, its container rooted in that image."""
    if not pods_from_images():
        print("pods run from this machine's environment (PODS_FROM=host): the user's image is not used")
        return
    built = subprocess.run(["buildah", "build", "--isolation", "chroot", "--layers", "-f", "examples/Containerfile",
                            "--build-arg", f"TRAINER_IMAGE={TRAINER_IMAGE}", "-t", USER_IMAGE, "examples"],
                           cwd=REPO, capture_output=True, text=True, check=False, timeout=900)
    if built.returncode != 0:
        raise Failed(f"buildah build of examples/Containerfile: {built.stderr[-1500:]}")
    name = "e2e-user"
    job = small_job(name, image=USER_IMAGE, model={"classPath": "lit_model.LitModel",
                                                   "initArgs": {"num_classes": 4, "lr": 0.001}})
    job["spec"]["trainer"]["maxEpochs"] = 2
    apply(job)
    eventually(lambda: running_gang(name), f"{name}: the gang Running", 300)
    root = container_root(pod(f"{name}-0"))
    if not root or root == "/" or not Path(root, "home", "dtrain", "models", "lit_model.py").is_file():
        raise Failed(f"{name}-0's container is not rooted in its image: {root!r}")
    finished(name)
    delete(name)
    eventually(lambda: not worker_pods(name), f"{name}: its pods gone", 120)
    subprocess.run(["buildah", "rmi", USER_IMAGE], capture_output=True, check=False)  # several GB: not kept


def scenario_image_missing(figures: Figures) -> None:
    """A job naming an image that is in no store: ErrImagePull, then ImagePullBackOff, and the operator says so."""
    if not pods_from_images():
        print("pods run from this machine's environment (PODS_FROM=host): no image is pulled")
        return
    name = "e2e-noimage"
    apply(small_job(name, image=f"{layout.IMAGE_REGISTRY}/no-such-trainer:1"))
    reasons: set[str] = set()

    def seen() -> bool:
        for target in worker_pods(name):
            for container in target["status"].get("containerStatuses") or []:
                reasons.add((container["state"].get("waiting") or {}).get("reason", ""))
        return {"ErrImagePull", "ImagePullBackOff"} <= reasons
    eventually(seen, f"{name}: ErrImagePull and ImagePullBackOff (seen: {reasons})", 120)
    said = eventually(lambda: [c for c in status(name).get("conditions") or [] if "image" in c.get("message", "").lower()
                               and c.get("status") == "True"], f"{name}: a condition naming the image", 180)
    print(f"the operator's condition: {said[0]['type']}: {said[0]['message'][:200]}")
    delete(name)


def _refused(result, *fragments: str) -> None:
    text = result.stderr + result.stdout
    if result.returncode == 0 or not all(f in text for f in fragments):
        raise Failed(f"expected a refusal naming {fragments}, got rc {result.returncode}: {text.strip()[:600]}")


def dtr_editor() -> Path:
    """The kubeconfig of a user who may edit DistributedTrainings in the jobs' namespace and nothing else."""
    kubectl("create", "role", "dtr-editor", "-n", NS, "--verb=get,list,watch,create,update,patch,delete",
            "--resource=distributedtrainings.dtrain.dev", check=False)
    kubectl("create", "rolebinding", "alice-dtr-editor", "-n", NS, "--role=dtr-editor", "--user=alice@example.com",
            check=False)
    return user_kubeconfig("alice@example.com")


OPERATOR_SECRETS = ("dtrain-operator-report-tls",)


def secrets_named(pod: dict[str, Any]) -> set[str]:
    """The Secrets a pod's volumes and environment read."""
    named = set()
    for volume in pod["spec"].get("volumes") or []:
        named.add((volume.get("secret") or {}).get("secretName"))
        named.update((source.get("secret") or {}).get("name") for source in (volume.get("projected") or {}).get("sources") or [])
    for container in pod["spec"].get("containers") or []:
        named.update(((var.get("valueFrom") or {}).get("secretKeyRef") or {}).get("name") for var in container.get("env") or [])
    return named - {None}


def scenario_tenancy(figures: Figures) -> None:
    """A user who may edit DistributedTrainings in the jobs' namespace and nothing else: a job as the operator's
    account, naming the operator's Secrets, asking for an API token or an account no administrator allowed is
    refused at kubectl apply (the chart's policy), in the operator's namespace too, and no pod with that identity
    or Secret ever exists; an account the chart allows runs."""
    alice = dtr_editor()
    operator_namespace = "dtrain-system"
    api_token = [{"name": "api", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]
    api_mount = [{"name": "api", "mountPath": "/api"}]
    attempts: list[tuple[str, dict[str, Any], str]] = [
        ("the operator's account", {"serviceAccountName": "dtrain-operator"}, "the dtrain operator's own account"),
        ("the operator's record key", {"volumes": [{"name": "key", "secret": {"secretName": OPERATOR_SECRETS[0]}}],
                                       "volumeMounts": [{"name": "key", "mountPath": "/key"}]},
         "names a Secret of the dtrain operator's"),
        ("the report endpoint's key in env", {"env": [{"name": "TLS", "valueFrom": {"secretKeyRef": {
            "name": OPERATOR_SECRETS[1], "key": "tls.key"}}}]}, "names a Secret of the dtrain operator's"),
        ("a token for the API", {"volumes": api_token, "volumeMounts": api_mount}, "a token for the Kubernetes API"),
        ("an account not allowed", {"serviceAccountName": "e2e-iam"}, "this account is not allowed in this namespace"),
    ]
    for what, spec, message in attempts:
        _refused(apply(small_job("e2e-tenancy", **spec), kubeconfig=alice, check=False), message)
        at_home = small_job("e2e-tenancy", **spec)
        at_home["metadata"]["namespace"] = operator_namespace
        # Alice has no right there at all; an administrator is refused by the policy.
        _refused(apply(at_home, kubeconfig=alice, check=False), "forbidden")
        _refused(apply(at_home, check=False), f"{operator_namespace} is the dtrain operator's own namespace")
        print(f"refused in {NS} and {operator_namespace}: {what}", flush=True)
    for pod in json.loads(kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]:
        where = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        if pod["spec"].get("serviceAccountName") == "dtrain-operator" and pod["metadata"]["namespace"] != operator_namespace:
            raise Failed(f"{where} runs as the operator's account")
        if secrets_named(pod) & set(OPERATOR_SECRETS):
            raise Failed(f"{where} reads a Secret of the operator's: {secrets_named(pod)}")
    # An administrator allows one account in the jobs' namespace: it runs there, and nowhere else.
    kubectl("create", "serviceaccount", "e2e-iam", "-n", NS, check=False)
    helm_upgrade(f"tenancy.allowedServiceAccounts={{{NS}/e2e-iam}}")
    # The upgraded operator (its new flag) leads before the job is made: the old one would refuse it.
    eventually(lambda: len(pods := operator_pods()) == 1 and lease_holder() == pods[0]["metadata"]["name"],
               "the upgraded operator leading", 120)
    name = "e2e-tenancy-iam"
    allowed = small_job(name, serviceAccountName="e2e-iam", volumes=api_token, volumeMounts=api_mount)
    # The API server takes the policy's new values within a moment of the upgrade.
    eventually(lambda: apply(allowed, kubeconfig=alice, check=False).returncode == 0, f"{name} admitted", 60)
    pods = eventually(lambda: len(p := worker_pods(name)) == 2 and p, f"{name}: its pods", 120)
    if {p["spec"]["serviceAccountName"] for p in pods} != {"e2e-iam"}:
        raise Failed(f"{name}: pods run as {[p['spec']['serviceAccountName'] for p in pods]}, expected e2e-iam")
    delete(name)


def scenario_status_record(figures: Figures) -> None:
    """A user's own credentials: the status, the operator's record of each job, can be neither written nor set."""
    alice = dtr_editor()
    job = small_job("e2e-status-record")
    job["spec"]["runPolicy"]["suspend"] = True  # nothing to run: only its status matters here
    forged = {**job, "status": {"phase": "Running", "restarts": 0,
                                "acceptedSpec": {**job["spec"], "hostNetwork": True}}}
    apply(forged, kubeconfig=alice)
    status = eventually(lambda: (s := get("dtr", "e2e-status-record", NS).get("status") or {}).get("acceptedSpec") and s,
                        "the operator's own status", 60)
    if status["acceptedSpec"].get("hostNetwork"):
        raise Failed("the status written at create was kept")
    patch = json.dumps({"status": {"restarts": 9}})
    _refused(kubectl("patch", "dtr", "e2e-status-record", "-n", NS, "--subresource=status", "--type=merge", "-p", patch,
                     kubeconfig=alice, check=False), "forbidden")
    # The chart's roles aggregated into Kubernetes' own: a namespace's editors edit jobs, never their status.
    kubectl("create", "rolebinding", "bob-edit", "-n", NS, "--clusterrole=edit", "--user=bob@example.com", check=False)
    for verb, extra, expected in (("create", (), "yes"), ("delete", (), "yes"), ("patch", ("--subresource=status",), "no"),
                                  ("update", ("--subresource=status",), "no")):
        answer = kubectl("auth", "can-i", verb, "distributedtrainings.dtrain.dev", "-n", NS, *extra,
                         "--as=bob@example.com", check=False).stdout.strip()
        if answer != expected:
            raise Failed(f"the edit role may {verb} distributedtrainings {' '.join(extra)}: {answer}, expected {expected}")
    kubectl("delete", "dtr", "e2e-status-record", "-n", NS, "--wait=false", kubeconfig=alice)

REPORT_SERVICE = "dtrain-operator.dtrain-system.svc"
# Run in a pod's network namespace (its hosts file is the cluster's DNS here): one report to the
# operator's Service, each address in turn past a standby's 503; prints the HTTP status.
POST_REPORT = """
import http.client, json, socket, ssl, sys
host, port, path, ca, token = sys.argv[1:6]
body = json.dumps({"records": [{"event": "progress", "step": 1, "time": "2026-12-02T00:00:00Z"}]})
status = 0
for address in sorted({i[4][0] for i in socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)}):
    context = ssl.create_default_context(cafile=ca)
    sock = context.wrap_socket(socket.create_connection((address, int(port)), 10), server_hostname=host)
    connection = http.client.HTTPSConnection(host, int(port))
    connection.sock = sock
    connection.request("POST", path, body, {"Authorization": f"Bearer {token}"} if token else {})
    status = connection.getresponse().status
    if status != 503:
        break
print(status)
"""


def report_from(pod: dict[str, Any], job: str, ca: Path, token: str | None) -> int:
    """The HTTP status the operator answers a report from inside `pod`'s network namespace."""
    result = subprocess.run(
        ["ip", "netns", "exec", pod_netns(pod), sys.executable, "-c", POST_REPORT, REPORT_SERVICE,
         str(contract.DEFAULT_REPORT_PORT), contract.report_path(NS, job), str(ca), token or ""],
        check=False, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise Failed(f"a report from {pod['metadata']['name']} did not reach the operator: {result.stderr[-600:]}")
    return int(result.stdout.split()[-1])


# Run in an attacking pod's network namespace: idle TLS connections to the report endpoint, held, and reports as
# fast as it can send them (oversized ones with its own rank 0's token, empty ones with made-up tokens) for a while.
ATTACK = r"""
import collections, http.client, json, socket, ssl, sys, time
host, port, path, ca, token, seconds = sys.argv[1:7]
addresses = sorted({i[4][0] for i in socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)})
context = ssl.create_default_context(cafile=ca)
held, closed = [], 0
for n in range(300):
    try:
        held.append(context.wrap_socket(socket.create_connection((addresses[n % len(addresses)], int(port)), 5),
                                        server_hostname=host))
    except OSError:
        closed += 1
huge = json.dumps({"records": [{"event": "progress", "step": 1, "metrics": {f"m{i}": 1.0 for i in range(500)}}]})
answers = collections.Counter()
deadline = time.monotonic() + float(seconds)
while time.monotonic() < deadline:
    for body, bearer in ((huge, token), ('{"records": []}', "made-up-token")):
        try:
            connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=5)
            connection.request("POST", path, body, {"Authorization": f"Bearer {bearer}"})
            answers[str(connection.getresponse().status)] += 1
            connection.close()
        except (OSError, http.client.HTTPException):
            answers["no answer"] += 1
print(json.dumps({"connections": len(held), "closed": closed, "answers": answers}))
"""


def scenario_report_flood(figures: Figures) -> None:
    """One job's pod attacks the report endpoint (held idle connections, reports as fast as it can, oversized and
    with made-up tokens) while another job trains: that job's progress keeps reaching its status, it restarts
    nothing and Succeeds, and the operator's container is not restarted."""
    honest, attacker = "e2e-honest", "e2e-attacker"
    long = {**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": 400}
    apply(small_job(honest))
    apply(small_job(attacker, nodes=1, trainer=long))
    eventually(lambda: progress_step(honest) > 0, f"{honest}: training", 300)
    victim = eventually(lambda: (p := pod(f"{attacker}-0"))["status"].get("phase") == "Running" and p,
                        f"{attacker}: its pod Running", 300)
    restarts = operator_pods()[0]["status"]["containerStatuses"][0]["restartCount"]
    ca = layout.STATE / "e2e-operator-ca.crt"
    config_map = next(v["configMap"]["name"] for v in victim["spec"]["volumes"] if v["name"] == contract.CONFIG_VOLUME)
    ca.write_text(get("configmap", config_map, NS)["data"][contract.OPERATOR_CA_FILE_NAME])
    token = kubectl("create", "token", "dtrain-trainer", "-n", NS, "--bound-object-kind=Pod",
                    f"--bound-object-name={attacker}-0", f"--audience={contract.OPERATOR_TOKEN_AUDIENCE}").stdout.strip()
    before = progress_step(honest)
    attack = subprocess.run(
        ["ip", "netns", "exec", pod_netns(victim), sys.executable, "-c", ATTACK, REPORT_SERVICE,
         str(contract.DEFAULT_REPORT_PORT), contract.report_path(NS, attacker), str(ca), token, "30"],
        check=False, capture_output=True, text=True, timeout=180)
    if attack.returncode != 0:
        raise Failed(f"the attack did not run: {attack.stderr[-800:]}")
    outcome = json.loads(attack.stdout.strip().splitlines()[-1])
    print(f"the attacker's pod: {outcome}", flush=True)
    if outcome["answers"].get("204") or not (outcome["answers"].get("429") or outcome["answers"].get("413")):
        raise Failed(f"the endpoint took the attack's reports: {outcome['answers']}")
    if progress_step(honest) <= before and status(honest).get("phase") != "Succeeded":
        raise Failed(f"{honest}: no progress in its status during the attack (step {before})")
    final = finished(honest)
    if final["restarts"] != 0:
        raise Failed(f"{honest}: {final['restarts']} restarts during another job's attack")
    if operator_pods()[0]["status"]["containerStatuses"][0]["restartCount"] != restarts:
        raise Failed("the operator's container restarted during the attack")
    metrics = (status(attacker).get("progress") or {}).get("metrics") or {}
    if len(metrics) > 64:
        raise Failed(f"{attacker}'s status took {len(metrics)} metrics")
    delete(honest)
    delete(attacker)


def scenario_tokens(figures: Figures) -> None:
    """Workers hold no API permission: progress reaches the status through the operator alone, which
    takes it only with a token for its audience bound to the job's rank-0 pod (the API server's
    TokenReview); each worker holds one such token (its supervisor reports its launch with it); the API
    server refuses that token, and every token of the trainers' account."""
    name = "e2e-tokens"
    apply(small_job(name, trainer={**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": 40}))
    eventually(lambda: len([p for p in worker_pods(name) if p["status"].get("phase") == "Running"]) == 2,
               f"{name}: two Running workers", 300)
    rank0, rank1 = (pod(f"{name}-{rank}") for rank in (0, 1))
    for worker in (rank0, rank1):
        if worker["spec"].get("automountServiceAccountToken") is not False:
            raise Failed(f"{worker['metadata']['name']} mounts a token for the API server")
    for worker in (rank0, rank1):
        projected = [v["projected"] for v in worker["spec"]["volumes"] if "projected" in v]
        audiences = [s["serviceAccountToken"]["audience"] for p in projected for s in p["sources"]]
        if audiences != [contract.OPERATOR_TOKEN_AUDIENCE]:
            raise Failed(f"{worker['metadata']['name']} should hold one token, for the operator; it holds {audiences}")
    # Rank 0's records reach the status, which only the operator writes.
    eventually(lambda: (get("dtr", name, NS).get("status", {}).get("progress") or {}).get("gangGeneration") == 0,
               f"{name}: progress in the status, stamped by the operator", 300)

    ca = layout.STATE / "e2e-operator-ca.crt"
    config_map = next(v["configMap"]["name"] for v in rank0["spec"]["volumes"] if v["name"] == contract.CONFIG_VOLUME)
    ca.write_text(get("configmap", config_map, NS)["data"][contract.OPERATOR_CA_FILE_NAME])

    def minted(pod_name: str, audience: str | None) -> str:
        args = ["create", "token", "dtrain-trainer", "-n", NS, "--bound-object-kind=Pod", f"--bound-object-name={pod_name}"]
        return kubectl(*args, *([f"--audience={audience}"] if audience else [])).stdout.strip()

    rank0_token = minted(f"{name}-0", contract.OPERATOR_TOKEN_AUDIENCE)
    cases = [
        ("no token", None, 401),
        ("a made-up token", "not-a-token", 401),
        ("rank 0's token for the API server's audience", minted(f"{name}-0", None), 401),
        ("rank 1's token for the operator", minted(f"{name}-1", contract.OPERATOR_TOKEN_AUDIENCE), 403),
        ("rank 0's token for the operator", rank0_token, 204),
    ]
    for who, token, expected in cases:
        answer = report_from(rank1, name, ca, token)
        if answer != expected:
            raise Failed(f"a report with {who} was answered {answer}, expected {expected}")
    # The API server refuses the operator's audience, and the trainers' account may do nothing.
    code, text = request_with_token(rank0_token, "GET", "/apis")
    if code != 401:
        raise Failed(f"the API server took a token for the operator's audience: {code} {text[:300]}")
    trainer = f"system:serviceaccount:{NS}:dtrain-trainer"
    for verb, resource, extra in (("patch", "distributedtrainings.dtrain.dev", ("--subresource=status",)),
                                  ("get", "distributedtrainings.dtrain.dev", ()), ("list", "pods", ()),
                                  ("get", "secrets", ()), ("create", "pods", ())):
        answer = kubectl("auth", "can-i", verb, resource, "-n", NS, *extra, f"--as={trainer}", check=False).stdout.strip()
        if answer != "no":
            raise Failed(f"the trainers' service account may {verb} {resource}: {answer}")
    operator = "system:serviceaccount:dtrain-system:dtrain-operator"
    status_subresource = "--subresource=status"
    # (who, the expected answer, verb, resource; the namespace and subresource as kubectl auth can-i takes them)
    checks: list[tuple[str, str, str, str, tuple[str, ...]]] = [
        (operator, "yes", "list", "distributedtrainings.dtrain.dev", ("--all-namespaces",)),
        (operator, "yes", "list", "pods", ("-n", NS)),
        (operator, "yes", "create", "pods", ("-n", NS)),
        # Its record of each job is the status; the object itself is the user's.
        (operator, "no", "patch", "distributedtrainings.dtrain.dev", ("-n", NS)),
        (operator, "yes", "patch", "distributedtrainings.dtrain.dev", ("-n", NS, status_subresource)),
        (operator, "yes", "create", "tokenreviews.authentication.k8s.io", ()),
        (operator, "no", "get", "secrets", ("-n", NS)),
        (operator, "no", "get", "secrets", ("-n", "kube-system")),
        (operator, "no", "create", "clusterrolebindings", ("-n", NS)),
        (operator, "yes", "get", "secrets/dtrain-operator-report-tls", ("-n", "dtrain-system")),
    ]
    for who, expected, verb, resource, where in checks:
        answer = kubectl("auth", "can-i", verb, resource, *where, f"--as={who}", check=False).stdout.strip()
        if answer != expected:
            raise Failed(f"{who} may {verb} {resource} {' '.join(where)}: {answer}, expected {expected}")
    kubectl("delete", "dtr", name, "-n", NS, "--wait=false")


# What the CRD itself refuses at `kubectl apply` (its schema and CEL rules), with the server's own message.
CRD_REFUSALS: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("nodes 0", lambda s: s.update(nodes=0), "spec.nodes"),
    ("an unknown accelerator", lambda s: s.update(accelerator="tpu"), "spec.accelerator"),
    ("a relative checkpoint dir", lambda s: s["checkpoint"].update(dir="checkpoints"), "spec.checkpoint.dir"),
    ("minBatch above maxBatch", lambda s: s.update(engine={"minBatch": 8, "maxBatch": 2}), "minBatch <= optBatch <= maxBatch"),
    ("a reserved env name", lambda s: s.update(env=[{"name": "PET_NNODES", "value": "9"}]), "spec.env"),
]

# What the CRD's transition rules (oldSelf) refuse on an edit of a job that is not suspended.
CRD_EDIT_REFUSALS: list[tuple[dict[str, Any], str]] = [
    ({"nodes": 3}, "spec.nodes is immutable"),
    ({"runPolicy": {"backoffLimit": 9}}, "spec.runPolicy.backoffLimit is immutable"),
    ({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}]}, "spec.volumes is immutable"),
    ({"scheduling": {"affinity": {"nodeAffinity": {}}}}, "spec.scheduling may change only while the job is suspended"),
]


# Of the bad jobs dtrain validate refuses (refusal_corpus), those the CRD's schema and CEL rules do not
# say, by why: the API server accepts them, and dtrain validate and the operator (its InvalidSpec
# condition) refuse them, naming the field.
POD_FIELDS = ("Kubernetes' pod fields, kept as written (x-kubernetes-preserve-unknown-fields): what a pod's "
              "validation refuses, and what would collide with the operator's own volumes and mounts")
QUANTITIES = "relations between quantities (sign, request <= limit, device counts): CEL's quantity library, not yet"
ACROSS_FIELDS = "rules across sibling fields or list items: not yet in CEL"
RANGE_ORDER = "the order of an exit-code range's two codes: CEL reads no number out of a string"
CRD_CANNOT_EXPRESS: dict[str, str] = {
    **dict.fromkeys([
        "affinity In without values", "affinity misspelt", "affinity of the wrong shape", "affinity operator",
        "affinity weight", "affinity without topologyKey", "emptyDir size not a quantity", "env empty valueFrom",
        "env fieldRef label key", "env secret name", "env secret without key", "env source misspelt",
        "env two sources", "env unsupported fieldRef", "env unsupported resource", "env value with valueFrom",
        "mount at the storage path", "mount inside the config", "mount of no volume", "mount of the config volume",
        "mount over shared memory", "mount subPath out of the volume", "mount without a path",
        "toleration Exists with a value", "toleration operator", "toleration seconds as a string",
        "toleration seconds without NoExecute", "two mounts at one path", "two volumes of one name",
        "volume claim without a name", "volume name not a DNS label", "volume of the operator's",
        "volume source of the wrong type", "volume with two sources", "volume without a source",
        "volume without name",
    ], POD_FIELDS),
    **dict.fromkeys(["negative quantity", "request above limit", "unknown resource", "fractional device",
                     "device request without limit"], QUANTITIES),
    **dict.fromkeys(["nccl var twice", "profiles naming other inputs", "profiles of other ranks"], ACROSS_FIELDS),
    "failure rule exit code range reversed": RANGE_ORDER,
}
# Bad files that are no DistributedTraining at all: kubectl refuses them before any schema applies.
NOT_A_DISTRIBUTED_TRAINING = {"no metadata", "wrong apiVersion", "wrong kind"}


def refusal_corpus() -> list[tuple[str, dict[str, Any], str]]:
    """Every bad job of the unit tests' tables that dtrain validate refuses: (case, the object, the field
    its line names). tests/unit/test_api.py's spec errors and tests/unit/test_job_files.py's pod fields."""
    from tests.unit.test_api import BAD_SPECS
    from tests.unit.test_job_files import REFUSED, job_text

    corpus = [(case, copy.deepcopy(obj), field) for case, obj, field in BAD_SPECS]
    corpus += [(case, yaml.safe_load(job_text(spec)), line.split(": ", 1)[0]) for case, spec, line in REFUSED]
    return corpus


def _names_field(message: str, field: str) -> bool:
    """Whether the API server's message names `field` or a field that holds it (spec.engine for spec.engine.x)."""
    path = field
    while path:
        if re.search(re.escape(path) + r'(?=[\s:.\["])', message):
            return True
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return False


def scenario_crd_refusals(figures: Figures) -> None:
    for title, change, fragment in CRD_REFUSALS:
        job = small_job("e2e-refused")
        change(job["spec"])
        result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(job), check=False)
        if result.returncode == 0 or fragment not in result.stderr:
            raise Failed(f"{title}: expected the API server to refuse it naming {fragment!r}: {result.stderr.strip()[:400]}")
        print(f"refused at kubectl apply: {title}: {result.stderr.strip().splitlines()[0][:160]}")
    # Edits, tried with --dry-run=server on a job that is not suspended but whose pods no node takes.
    edited = "e2e-edited"
    apply(small_job(edited, scheduling={"nodeSelector": {"dtrain.dev/e2e": "no-such-node"}}))

    def edit(change: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return kubectl("patch", "dtr", edited, "-n", NS, "--type=merge", "--dry-run=server",
                       "-p", json.dumps({"spec": change}), check=False)

    for change, fragment in CRD_EDIT_REFUSALS:
        result = edit(change)
        if result.returncode == 0 or fragment not in result.stderr:
            raise Failed(f"an edit of {change}: expected the API server to refuse it with {fragment!r}: "
                         f"{(result.stderr or result.stdout).strip()[:400]}")
        print(f"refused at kubectl patch: {result.stderr.strip().splitlines()[0][:160]}")
    result = edit({"runPolicy": {"ttlSecondsAfterFinished": 60}})
    if result.returncode != 0:
        raise Failed(f"an edit of a mutable field was refused: {result.stderr.strip()[:400]}")
    delete(edited)
    # Every bad job dtrain validate refuses: the API server refuses it too, naming the field, unless the
    # CRD cannot say it (CRD_CANNOT_EXPRESS, listed here as the server accepts them).
    accepted, misnamed, refused = [], [], 0
    for case, obj, field in refusal_corpus():
        obj.setdefault("metadata", {})["namespace"] = NS
        result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(obj), check=False)
        if result.returncode == 0:
            accepted.append(case)
        elif case not in NOT_A_DISTRIBUTED_TRAINING and not _names_field(result.stderr, field):
            misnamed.append(f"{case}: {field} not named in {result.stderr.strip()[:300]!r}")
        else:
            refused += 1
    print(f"{refused} of {refused + len(accepted) + len(misnamed)} bad jobs dtrain validate refuses are refused at "
          f"kubectl apply, naming the field; the CRD does not express {len(accepted)} (dtrain validate and the "
          "operator refuse them):")
    for why in dict.fromkeys(CRD_CANNOT_EXPRESS.values()):
        cases = sorted(case for case in accepted if CRD_CANNOT_EXPRESS.get(case) == why)
        print(f"  {why}: {', '.join(cases)}")
    unexpected, stale = set(accepted) - set(CRD_CANNOT_EXPRESS), set(CRD_CANNOT_EXPRESS) - set(accepted)
    if misnamed or unexpected or stale:
        raise Failed(f"refused without naming the field: {misnamed}; accepted by the API server though the CRD "
                     f"should refuse them: {sorted(unexpected)}; in CRD_CANNOT_EXPRESS but refused: {sorted(stale)}")


GANG_NODES = E2E_NODES + 1
# A few epochs of the small job: the scenario is about placement, not training.
GANG_EPOCHS = 3
PENDING_SECONDS = 5
UNBOUND_SECONDS = 20


def gpu_job(name: str, **spec: Any) -> dict[str, Any]:
    """The small job on one more node than the cluster has, each worker on one nvidia.com/gpu.

    The nodes' GPUs are a count the scheduler places by, with no device behind it: each trainer sees no
    CUDA device and trains on the CPU (gloo) with one warning, as `dtrain run` does without CUDA."""
    trainer = {**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": GANG_EPOCHS}
    return small_job(name, nodes=GANG_NODES, accelerator="gpu", devicesPerNode=1, trainer=trainer,
                     terminationGracePeriodSeconds=15, **spec)


def node_gpus() -> dict[str, str]:
    """Each node's allocatable nvidia.com/gpu count."""
    return {n["metadata"]["name"]: str((n.get("status", {}).get("allocatable") or {}).get(GPU, "0"))
            for n in items("nodes")}


def bound(name: str) -> dict[str, str]:
    """The job's worker pods that the scheduler bound, with their node."""
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in worker_pods(name) if p["spec"].get("nodeName")}


def scheduler_messages(name: str) -> dict[str, str]:
    """Each worker pod's PodScheduled condition, as the scheduler wrote it."""
    return {p["metadata"]["name"]: next((f"{c['status']} {c.get('reason', '')}: {c.get('message', '')}"
                                         for c in p["status"].get("conditions") or [] if c["type"] == "PodScheduled"),
                                        "no PodScheduled condition") for p in worker_pods(name)}


@dataclass(frozen=True)
class GangProvider:
    """What differs between the gang scenarios' providers: the job's spec.scheduling, the PodGroup's
    resource, how a worker names its PodGroup, and what the scheduler's messages say of the gang."""

    label: str
    scheduling: dict[str, Any]
    pod_groups: str
    group_of: Callable[[dict[str, Any]], str | None]
    no_group: str  # why the workers might name no PodGroup
    says_why: Callable[[str], bool]  # the PodsPending condition's message quotes the scheduler on the gang
    # What one of the scheduler's FailedScheduling Events on the workers says (checked when given).
    scheduler_event_says_why: Callable[[str], bool] | None = None


NATIVE_GANG = GangProvider(
    label="Kubernetes' own",
    scheduling={"gang": {"enabled": True, "provider": "kubernetes", "scheduleTimeoutSeconds": PENDING_SECONDS}},
    pod_groups="podgroups.scheduling.k8s.io",
    group_of=lambda p: (p["spec"].get("schedulingGroup") or {}).get("podGroupName"),
    no_group="spec.schedulingGroup dropped by an API server without the GenericWorkload feature gate?",
    says_why=lambda message: "pod group" in message,
)
COSCHEDULING_GANG = GangProvider(
    label="scheduler-plugins' coscheduling",
    scheduling={"schedulerName": schedulers.SCHEDULER_NAME,
                "gang": {"enabled": True, "provider": "scheduler-plugins", "scheduleTimeoutSeconds": PENDING_SECONDS}},
    pod_groups="podgroups.scheduling.x-k8s.io",
    group_of=lambda p: p["metadata"]["labels"].get(COSCHEDULING_GROUP_LABEL),
    no_group="the scheduling.x-k8s.io/pod-group label missing",
    # The pods' conditions end on the plugin's rejection of the gang ("optimistic rejection in PostFilter",
    # "rejection in Unreserve", "PodGroup ... gets rejected"): each placed pod waits at Permit, and all are
    # rejected when one finds no room.
    says_why=lambda message: "rejection in" in message or "gets rejected" in message,
    # The pod that found no room: "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. ..., PodGroup
    # default/e2e-cosched gets rejected due to Pod e2e-cosched-3 is unschedulable even after PostFilter".
    scheduler_event_says_why=lambda message: f"Insufficient {GPU}" in message and "gets rejected" in message,
)


def gpu_nodes_or_skip(exactly: int | None = None) -> int | None:
    """The number of nodes when each has E2E_GPUS_PER_NODE nvidia.com/gpu (and `exactly` of them, if given);
    else None, having said why the scenario is skipped."""
    gpus = node_gpus()
    if gpus and set(gpus.values()) == {str(E2E_GPUS_PER_NODE)} and exactly in (None, len(gpus)):
        return len(gpus)
    print(f"needs {exactly or 'nodes'} {'nodes ' if exactly else ''}of {E2E_GPUS_PER_NODE} {GPU} each (python -m "
          f"localcluster up {' '.join(e2e_cluster_arguments())}, as python -m tests.cluster starts it), not {gpus}: "
          "skipped")
    return None


def scenario_gang(figures: Figures) -> None:
    """Kubernetes' own gang scheduling (spec.scheduling.gang.provider: kubernetes, the default scheduler's
    GangScheduling plugin) on 2 nodes of one nvidia.com/gpu each. Without a gang, a job of 3 GPU workers
    gets 2 placed, which wait for the third (NODES 2/3). With one, none is placed, the job's PodsPending
    condition and Warning Event say the pod group is unschedulable; a node joins (python -m localcluster
    join) and the whole gang is placed at once and trains to Succeeded. Then two gangs that each fit alone
    but not together do not deadlock, and a gang that asks for one rack lands in one. Last: it leaves the
    third node."""
    if gpu_nodes_or_skip(exactly=E2E_NODES) is None:
        return
    # Without a gang, the scheduler places pod by pod: two run, and wait for the third at the rendezvous.
    partial = "e2e-nogang"
    apply(gpu_job(partial, scheduling={"gang": {"scheduleTimeoutSeconds": PENDING_SECONDS}}))
    eventually(lambda: len(worker_pods(partial)) == GANG_NODES and len(bound(partial)) == E2E_NODES
               and status(partial).get("nodesReady") == f"{E2E_NODES}/{GANG_NODES}",
               f"{partial}: {E2E_NODES} of {GANG_NODES} workers bound and Running (NODES {E2E_NODES}/{GANG_NODES})", 300)
    counts = status(partial).get("nodes") or {}
    column = kubectl("get", "dtr", partial, "-n", NS, "--no-headers").stdout.split()
    if (counts.get("running"), counts.get("pending"), column[2:3]) != (E2E_NODES, 1, [f"{E2E_NODES}/{GANG_NODES}"]):
        raise Failed(f"{partial}: status.nodes {counts}, kubectl get dtr {column}: expected {E2E_NODES} running, "
                     f"1 pending, NODES {E2E_NODES}/{GANG_NODES}")
    pods = worker_pods(partial)
    (unbound,) = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName")]
    try:
        said = eventually(lambda: (c := condition(partial, "PodsPending")).get("status") == "True"
                          and unbound in c["message"] and GPU in c["message"] and c,
                          f"{partial}: the PodsPending condition naming {unbound} and the GPUs it lacks", 60)
    except Failed as exc:
        raise Failed(f"{exc}: the condition {condition(partial, 'PodsPending')}") from None
    print(f"without a gang: {sorted(bound(partial).items())} bound, NODES {column[2]}; {said['message'][:300]}")
    kubectl("delete", "dtr", partial, "-n", NS, "--wait=false")
    eventually(lambda: not worker_pods(partial), f"{partial}: its pods gone (their GPUs free)", 180)

    gang_waits_whole_until_a_node_joins("e2e-gang", NATIVE_GANG, E2E_NODES, figures)
    two_gangs_do_not_deadlock(figures)
    gang_in_one_rack()


def scenario_gang_coscheduling(figures: Figures) -> None:
    """The same all-or-nothing gang through scheduler-plugins' coscheduling scheduler (a second scheduler,
    python -m localcluster up --schedulers coscheduling, which python -m tests.cluster starts for this
    scenario): one GPU worker more than the cluster's nodes (4 after the gang scenario's join, 3 alone),
    none bound, the job says why; a node joins, all bind and it trains to Succeeded. It leaves that node."""
    if not processes.running(schedulers.PROCESS):
        print(f"needs scheduler-plugins' coscheduling scheduler (python -m localcluster up --schedulers coscheduling, "
              f"as python -m tests.cluster starts it for this scenario): {schedulers.PROCESS} does not run: skipped")
        return
    nodes = gpu_nodes_or_skip()
    if nodes is not None:
        gang_waits_whole_until_a_node_joins("e2e-cosched", COSCHEDULING_GANG, nodes, figures)


def gang_waits_whole_until_a_node_joins(name: str, provider: GangProvider, nodes: int, figures: Figures) -> None:
    """A gang of one GPU worker per node and one more: none bound, however long one looks, and the job's
    PodsPending condition, a Warning Event and NODES 0/N say so; then a node joins, the whole gang is
    placed at once, one worker per node, and trains to Succeeded; deleted, its GPUs free."""
    size = nodes + 1
    job = gpu_job(name, scheduling=provider.scheduling)
    job["spec"]["nodes"] = size
    apply(job)
    pods = eventually(lambda: len(found := worker_pods(name)) == size and found, f"{name}: {size} worker pods", 120)
    groups = {provider.group_of(p) for p in pods}
    if len(groups) != 1 or None in groups:
        raise Failed(f"{name}: the workers' PodGroups: {groups} ({provider.no_group})")
    (group,) = groups
    if get(provider.pod_groups, group, NS) is None:
        raise Failed(f"{name}: no {provider.pod_groups} {group}")
    # All or nothing: with one GPU too few, none is bound, however long one looks.
    watched_until = time.monotonic() + UNBOUND_SECONDS
    while time.monotonic() < watched_until:
        if bound(name):
            raise Failed(f"{name}: part of the gang was placed on {nodes} nodes: {bound(name)}")
        time.sleep(1)
    names = [f"{name}-{rank}" for rank in range(size)]
    try:
        said = eventually(lambda: (c := condition(name, "PodsPending")).get("status") == "True"
                          and provider.says_why(c["message"]) and all(n in c["message"] for n in names) and c,
                          f"{name}: the PodsPending condition naming the {size} pods and why", 60)
    except Failed as exc:
        raise Failed(f"{exc}: the condition {condition(name, 'PodsPending')}; the scheduler's "
                     f"{scheduler_messages(name)}") from None
    eventually(lambda: [e for e in events(name, "PodsPending") if e["type"] == "Warning"],
               f"{name}: a Warning Event PodsPending", 60)
    if provider.scheduler_event_says_why is not None:
        told = eventually(lambda: next((e["message"] for e in items("events", NS) if e["reason"] == "FailedScheduling"
                                        and e["involvedObject"].get("name") in names
                                        and provider.scheduler_event_says_why(e["message"])), None),
                          f"{name}: the scheduler's FailedScheduling Event on a worker saying why", 60)
        print(f"the scheduler's Event: {told[:400]}")
    group_status = (get(provider.pod_groups, group, NS) or {}).get("status") or {}
    waiting = kubectl("get", "dtr", name, "-n", NS).stdout
    if f"0/{size}" not in waiting:
        raise Failed(f"{name}: kubectl get dtr while the gang waits:\n{waiting}")
    print(f"{provider.label} gang: none bound for {UNBOUND_SECONDS} s; {said['message'][:600]}; "
          f"PodGroup {group}: {json.dumps(group_status)[:300]}")
    print(f"kubectl get dtr while the gang waits:\n{waiting}")

    if localcluster("join") != 0:
        raise Failed("python -m localcluster join failed (above)")
    joined = time.monotonic()
    eventually(lambda: running_gang(name, nodes=size), f"{name}: all {size} workers Running", 300)
    figures[f"node joined → the waiting gang of {size} all Running, {provider.label} (s)"] = time.monotonic() - joined
    placed = set(bound(name).values())
    if len(placed) != size:
        raise Failed(f"{name}: {size} workers of one GPU each on {sorted(placed)}")
    # No CUDA device behind the counted GPU: rank 0 says once that it trains on the CPU.
    eventually(lambda: kubectl("logs", f"{name}-0", "-n", NS, check=False).stdout.count("training on the CPU") == 1,
               f"{name}-0: one warning that it trains on the CPU", 120)
    final = finished(name)
    if final["restarts"] != 0:
        raise Failed(f"{name}: restarts {final['restarts']}, expected 0")
    print(f"after the join: the gang on {sorted(placed)}, Succeeded")
    delete(name)
    eventually(lambda: not worker_pods(name), f"{name}: its pods gone (their GPUs free)", 180)


# The elastic job: 3 GPU workers, down to 2; a short wait for a pod that cannot be placed. The tests' own model and
# data module (from the shared claim: PYTHONPATH) record every sample id each rank trains; a step is slowed to a
# pace that outlasts a node's loss and return. 192 samples, global batches of 16 x 3: 4 steps an epoch, no sample
# left over, and a step checkpoint at each epoch's end.
ELASTIC_NODES, ELASTIC_MIN_NODES, ELASTIC_WAIT_SECONDS, ELASTIC_EPOCHS = 3, 2, 20, 40
ELASTIC_SAMPLES, ELASTIC_STEP_SECONDS = 192, 0.25
USER_CODE = REPO / "tests" / "trainer" / "user_code" / "dtrain_test_user.py"


def elastic_size(name: str) -> tuple[int | None, str | None, str | None]:
    """status.elastic.nodes, the phase and NODES as the job's status says them."""
    found = status(name)
    return (found.get("elastic") or {}).get("nodes"), found.get("phase"), found.get("nodesReady")


def scenario_elastic(figures: Figures) -> None:
    """An elastic job (spec.elastic, minNodes 2) of 3 GPU workers on 3 nodes of one nvidia.com/gpu each. A node
    is lost (python -m localcluster lose: its kubelet stopped, its Node deleted; the pod garbage collector deletes
    its pod about 40 s later): the gang restarts (counted once when a surviving rank's collective error is seen
    before the lost pod is gone), the pod replacing the lost one cannot be placed, and after
    waitSeconds the job trains on 2 nodes (NODES 2/2 of 3, a GangShrunk Event saying how the global batch is
    kept). The node returns (rejoin): a standby pod is placed on it and the gang grows back to 3 at its next
    checkpoint (GangGrown). It ends Succeeded, the resizes not counted, and the sample ids the ranks recorded show
    every sample trained exactly once in each epoch, across the resizes."""
    nodes = gpu_nodes_or_skip()
    if nodes is None:
        return
    for _ in range(ELASTIC_NODES - nodes):
        if localcluster("join") != 0:
            raise Failed("python -m localcluster join failed (above)")
    name = "e2e-elastic"
    claim = layout.VOLUMES / NS / CLAIM
    code, samples = claim / f"{name}-code", claim / f"{name}-samples"
    for old in claim.glob(f"{samples.name}.rank*"):
        old.unlink()
    code.mkdir(exist_ok=True)
    shutil.copy(USER_CODE, code / USER_CODE.name)
    trainer = {**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": ELASTIC_EPOCHS}
    apply(small_job(
        name, nodes=ELASTIC_NODES, accelerator="gpu", devicesPerNode=1, trainer=trainer,
        terminationGracePeriodSeconds=15, runPolicy={"backoffLimit": 2},
        elastic={"minNodes": ELASTIC_MIN_NODES, "waitSeconds": ELASTIC_WAIT_SECONDS},
        env=[{"name": "PYTHONPATH", "value": f"/workspace/{code.name}"}],
        model={"classPath": "dtrain_test_user.TinyClassifier", "initArgs": {
            "sample_log": f"/workspace/{samples.name}", "step_sleep": ELASTIC_STEP_SECONDS}},
        data={"classPath": "dtrain_test_user.IndexedImageData", "initArgs": {"num_samples": ELASTIC_SAMPLES}},
    ))
    eventually(lambda: running_gang(name, nodes=ELASTIC_NODES) and checkpoint_step(name) >= 4,
               f"{name}: all {ELASTIC_NODES} workers training, a checkpoint written", 300)
    last = max(worker_pods(name), key=lambda p: int(p["metadata"]["labels"][contract.LABEL_NODE_RANK]))
    lost = last["spec"]["nodeName"]
    at_loss = progress_step(name)
    if localcluster("lose", lost) != 0:
        raise Failed(f"python -m localcluster lose {lost} failed (above)")
    since = time.monotonic()
    eventually(lambda: elastic_size(name)[:2] == (ELASTIC_MIN_NODES, "Running") and progress_step(name) > at_loss,
               f"{name}: training again on {ELASTIC_MIN_NODES} nodes after {lost} was lost", 300)
    figures[f"node lost → training on {ELASTIC_MIN_NODES} of {ELASTIC_NODES} nodes (s)"] = time.monotonic() - since
    shrunk = eventually(lambda: events(name, "GangShrunk"), f"{name}: a GangShrunk Event", 60)[0]["message"]
    print(f"after {lost} was lost: {shrunk}")
    print(kubectl("get", "dtr", name, "-n", NS).stdout)
    if elastic_size(name)[2] != f"{ELASTIC_MIN_NODES}/{ELASTIC_MIN_NODES} of {ELASTIC_NODES}" or "keep the global batch" not in shrunk:
        raise Failed(f"{name}: NODES {elastic_size(name)[2]}, the Event {shrunk!r}")

    if localcluster("rejoin", lost) != 0:
        raise Failed(f"python -m localcluster rejoin {lost} failed (above)")
    since = time.monotonic()
    eventually(lambda: elastic_size(name) == (ELASTIC_NODES, "Running", f"{ELASTIC_NODES}/{ELASTIC_NODES}")
               and running_gang(name, nodes=ELASTIC_NODES),
               f"{name}: grown back to {ELASTIC_NODES} nodes after {lost} returned", 300)
    grown_at = progress_step(name)
    eventually(lambda: progress_step(name) > grown_at, f"{name}: training on {ELASTIC_NODES} nodes", 300)
    figures[f"capacity back → training on all {ELASTIC_NODES} nodes (s)"] = time.monotonic() - since
    grown = eventually(lambda: events(name, "GangGrown"), f"{name}: a GangGrown Event", 60)[0]["message"]
    print(f"after {lost} returned: {grown}")
    if items("pods", NS, f"{contract.LABEL_JOB_NAME}={name},{contract.LABEL_ROLE}={contract.ROLE_STANDBY}"):
        raise Failed(f"{name}: standby pods left once the gang is whole")
    final = finished(name, timeout=1800)
    resizes = (final.get("elastic") or {}).get("resizes")
    # The node's loss itself counts once at most (a survivor's collective error seen first); the resizes never.
    if final.get("restarts") not in (0, 1) or resizes != 2:
        raise Failed(f"{name}: restarts {final.get('restarts')}, resizes {resizes}: expected at most 1 and 2")
    # Each epoch trained every sample exactly once, across the resizes: the ids each step's gang recorded.
    trained = trained_samples(samples)
    steps, per_epoch = final["progress"]["step"], ELASTIC_SAMPLES // (trainer["batchSize"] * ELASTIC_NODES)
    expected = [(step // per_epoch, step) for step in range(ELASTIC_EPOCHS * per_epoch)]
    if steps != len(expected) or list(trained) != expected:
        out_of_place = next((key for key, want in zip(trained, expected) if key != want), None)
        raise Failed(f"{name}: {steps} steps for {ELASTIC_EPOCHS} epochs of {per_epoch}; the sample logs record "
                     f"{len(trained)} (epoch, step), the first out of place {out_of_place}")
    for epoch in range(ELASTIC_EPOCHS):
        ids = sorted(i for (e, _), step_ids in trained.items() if e == epoch for i in step_ids)
        if ids != list(range(ELASTIC_SAMPLES)):
            raise Failed(f"{name}: epoch {epoch} trained {len(ids)} samples, {len(set(ids))} distinct, of "
                         f"{ELASTIC_SAMPLES}")
    print(f"{name}: Succeeded after {resizes} resizes, {final.get('restartsIgnoringBackoff')} restarts not counted; "
          f"every one of the {ELASTIC_SAMPLES} samples trained once in each of {ELASTIC_EPOCHS} epochs")
    delete(name)
    eventually(lambda: not worker_pods(name), f"{name}: its pods gone (their GPUs free)", 180)


RACK = "e2e.dtrain.dev/rack"


def gang_in_one_rack() -> None:
    """Nodes labelled into two racks (node-1 alone in rack-a): a gang that asks for one rack
    (scheduling.topology.required) lands in one rack, whichever its first worker is placed in."""
    nodes = sorted(n["metadata"]["name"] for n in items("nodes"))
    racks = {node: "rack-a" if index == 0 else "rack-b" for index, node in enumerate(nodes)}
    for node, rack in racks.items():
        kubectl("label", "node", node, f"{RACK}={rack}", "--overwrite")
    name = "e2e-rack"
    try:
        job = small_job(name, scheduling={"topology": {"required": RACK},
                                          "gang": {"enabled": True, "provider": "kubernetes"}})
        job["spec"]["trainer"]["maxEpochs"] = GANG_EPOCHS
        apply(job)
        eventually(lambda: running_gang(name), f"{name}: both workers Running", 300)
        placed = bound(name)
        if len({racks[node] for node in placed.values()}) != 1:
            raise Failed(f"{name}: the gang spans racks: {placed} ({racks})")
        finished(name)
        print(f"one rack: {name} on {placed}, all in {racks[next(iter(placed.values()))]}")
    finally:
        delete(name)
        for node in racks:
            kubectl("label", "node", node, f"{RACK}-", check=False)


def two_gangs_do_not_deadlock(figures: Figures) -> None:
    """Two gangs of 2 GPU workers on 3 GPUs: each fits alone, not both. Placed pod by pod they could
    hold 1 + 2 or 2 + 1 GPUs and wait for each other for ever; as gangs, one runs whole, the other
    waits whole (no pod bound) and runs when the first is done."""
    gangs = ["e2e-gang-a", "e2e-gang-b"]
    for gang in gangs:
        job = gpu_job(gang, scheduling={"gang": {"enabled": True, "provider": "kubernetes"}})
        job["spec"]["nodes"] = 2
        apply(job)
    first = eventually(lambda: next((g for g in gangs if running_gang(g)), None), "one gang Running whole", 300)
    (second,) = [g for g in gangs if g != first]
    if bound(second):
        raise Failed(f"{second} holds GPUs while {first} runs: {bound(second)}")
    finished(first)
    freed = time.monotonic()
    eventually(lambda: running_gang(second), f"{second}: Running whole once {first} is done", 300)
    figures["gang done → the waiting gang of 2 all Running (s)"] = time.monotonic() - freed
    finished(second)
    print(f"two gangs: {first} ran whole while {second} waited with no pod bound; then {second} ran and Succeeded")
    for gang in gangs:
        delete(gang)


SCENARIOS: list[tuple[str, str, Callable[[Figures], None]]] = [
    ("crd-refusals", "what the CRD refuses at kubectl apply and on an edit, with the API server's own message",
     scenario_crd_refusals),
    ("wrong-jobs", ("the wrong-jobs corpus and a few hundred working variants through the API server and the operator: "
                    "each refused before anything runs, or every child created"), scenario_wrong_jobs),
    ("status-record", "the status, the operator's record: neither set nor written with a user's own credentials",
     scenario_status_record),
    ("tenancy", ("a user's own credentials: no job as the operator, with its Secrets, an API token or an account no "
                 "administrator allowed, nor in the operator's namespace; an allowed account runs"), scenario_tenancy),
    ("quickstart", "the quick start: kubectl apply → training → engine Job → kubectl delete; then dtrain run",
     scenario_quickstart),
    ("in-place-restart", ("a training process SIGKILLed, restartStrategy InPlace and Recreate side by side: the "
                          "same pods or new ones, time to train again, steps lost"), scenario_in_place_restart),
    ("object-storage", "the quick start on s3://: worker SIGKILL → resume from the bucket → engine Job on the bucket",
     scenario_object_storage),
    ("network-cut", "network cut → restart within the collective timeout", scenario_network_cut),
    ("hang", "a hang (link cut, long collective timeout) → progress deadline → gang restart", scenario_hang),
    ("straggler", "one pod's link slowed (tc tbf) → the straggler Event names that pod", scenario_straggler),
    ("wrong-interface", "a wrong nccl.socketIfname → the job fails in pre-flight", scenario_wrong_interface),
    ("operator-kill", "the operator's process SIGKILLed → its container restarts, nothing created twice",
     scenario_operator_killed),
    ("suspend", "suspend and resume", scenario_suspend_resume),
    ("delete", "delete → every process gone, the pods' network namespaces removed", scenario_delete),
    ("engine-backoff", "engine Job failing → retried up to its backoffLimit → job Failed", scenario_engine_backoff),
    ("tokens", ("workers hold no API permission: progress through the operator, tokens as the API server and the "
                "operator's TokenReview judge them"), scenario_tokens),
    ("report-flood", ("one job's pod floods the report endpoint (idle connections, oversized reports, made-up tokens) "
                      "while another trains: its progress still reaches its status, no restart, the operator stands"),
     scenario_report_flood),
    ("user-image", "a user's image FROM the trainer image (examples/Containerfile) trains to Succeeded", scenario_user_image),
    ("image-missing", "an image in no store → ErrImagePull, ImagePullBackOff, the operator's condition", scenario_image_missing),
    ("back-to-back", ("a dozen short 2-node jobs, two at a time: each Succeeded within a bound, no restart, no "
                      "torchrun started again after its rank finished"), scenario_back_to_back),
    ("leader-failover", "two operator replicas: the leader's pod lost → the standby leads", scenario_leader_failover),
    ("control-plane-outage", "kube-apiserver, then etcd, stopped for 20 s during training", scenario_control_plane_outage),
    # Last: gang needs the 2 nodes the cluster starts with and leaves a third joined, elastic needs 3 and leaves them,
    # and the coscheduling gang is one larger than the nodes there are.
    ("gang", ("Kubernetes' own gang scheduling: 3 GPU workers on 2 GPU nodes none placed, the job says why; a node "
              "joins → the gang placed whole → Succeeded; two gangs that fit alone, not together: no deadlock; "
              "a gang that asks for one rack lands in one rack"),
     scenario_gang),
    ("elastic", ("an elastic job of 3 GPU workers: a node lost → training on 2 with the global batch kept; the "
                 "node back → grown to 3 at the next checkpoint → Succeeded, the resizes not counted"), scenario_elastic),
    ("gang-coscheduling", ("scheduler-plugins' coscheduling: a gang of one GPU worker more than the nodes, none "
                           "placed, the job says why; a node joins → all placed → Succeeded"),
     scenario_gang_coscheduling),
]
# The second schedulers a scenario needs, which python -m tests.cluster starts the cluster with when it runs.
SCENARIO_SCHEDULERS = {"gang-coscheduling": "coscheduling"}
