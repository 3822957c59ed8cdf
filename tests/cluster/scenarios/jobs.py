"""The user's path with kubectl: the quick start, suspend, delete, the engine Job's retries, jobs back to
back, and the pods' images (a user's own, one in no store)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from localcluster import layout

from dtrain_operator.api import contract

from ..kube import (
    REPO,
    Failed,
    apply,
    eventually,
    get,
    items,
    kubectl,
    pod_netns,
    pod_processes,
    status,
    worker_pods,
)
from .common import (
    CLAIM,
    ENGINE_IMAGE,
    ENGINE_RESOURCES,
    NS,
    QUICKSTART,
    QUICKSTART_STEPS_VARIABLE,
    README,
    SMALL_JOB,
    TRAINER_IMAGE,
    TRAINING_TIMEOUT,
    USER_IMAGE,
    Figures,
    checkpoint_step,
    children,
    delete,
    finished,
    logged_step,
    pod,
    progress_step,
    running_gang,
    small_job,
    with_engine,
)


def walkthrough_commands(storage: str) -> str:
    """The shell lines of the README's "3. Submit." that make my-job.yaml, as a user runs them: with the
    claim's printf line (storage "claim"), or with the object-storage one uncommented instead ("s3")."""
    block = readme_step("**3. Submit.**", "**4. Watch.**").split("```", 2)[1]
    lines = []
    for line in block.splitlines():
        if line.startswith("dtrain submit"):
            continue  # the scenario submits the file itself, once it is made for this cluster (submit_as_readme)
        if storage == "s3" and line.startswith("printf '  storage:\\n    claimName"):
            continue
        if storage == "s3" and line.startswith("#   printf"):
            line = line.removeprefix("#   ")
        lines.append(line)
    return "\n".join(lines)


def readme_step(start: str, end: str) -> str:
    """The README's text from `start` to the first `end` after it: one step of its cluster walkthrough."""
    text = README.read_text()
    step = text[text.index(start):]
    return step[:step.index(end, len(start))]


def readme_commands(start: str, end: str, inline: bool = False) -> list[str]:
    """The `dtrain` commands of one step of the README's cluster walkthrough, as printed: the command lines of its
    code block (their comments cut), or with `inline` the ones quoted in its text."""
    step = readme_step(start, end)
    if inline:
        return re.findall(r"`(dtrain [^`]+)`", step)
    block = step.split("```", 2)[1]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.startswith("dtrain ")]


def readme_command(command: str, timeout: float = 120, cwd: Path | None = None) -> str:
    """One of the README's dtrain commands, run as a user runs it with this cluster's kubeconfig; its output."""
    ran = subprocess.run([str(Path(sys.executable).parent / "dtrain"), *command.split()[1:]], capture_output=True,
                         text=True, check=False, timeout=timeout, cwd=cwd,
                         env={**os.environ, "KUBECONFIG": str(layout.KUBECONFIG)})
    if ran.returncode != 0:
        raise Failed(f"the README's `{command}` failed ({ran.returncode}): {(ran.stdout + ran.stderr)[-1500:]}")
    return ran.stdout


def watch_as_readme(name: str) -> None:
    """The README's "4. Watch." as printed, with the dtrain command: its table, then watch to the job's end (the
    command's exit 0: the job succeeded), then rank 1's log."""
    get_all, watch, logs = readme_commands("**4. Watch.**", "**5. Get the results**")
    table = readme_command(get_all)
    if name not in table or "GOODPUT" not in table:
        raise Failed(f"`{get_all}` does not list the job with its columns: {table}")
    readme_command(watch, timeout=TRAINING_TIMEOUT)
    if "pre-flight:" not in readme_command(logs):  # every rank logs its pre-flight check
        raise Failed(f"`{logs}` shows no trainer log")


def results_as_readme(name: str) -> None:
    """The README's "5. Get the results": status.artifacts in the job as dtrain prints it, then the job deleted."""
    show, remove = readme_commands("**5. Get the results**", "\n## ", inline=True)
    if contract.ONNX_FILE_NAME not in readme_command(show):
        raise Failed(f"`{show}` does not show {contract.ONNX_FILE_NAME} in status.artifacts")
    readme_command(remove)
    eventually(lambda: get("dtr", name) is None, f"{name}: deleted", 120)


def submit_as_readme(job: dict[str, Any]) -> None:
    """The README's `dtrain submit` line of "3. Submit.", run on `job` written as my-job.yaml."""
    (submit,) = readme_commands("**3. Submit.**", "**4. Watch.**")
    with tempfile.TemporaryDirectory(prefix="dtrain-e2e-submit-") as folder:
        Path(folder, "my-job.yaml").write_text(yaml.safe_dump(job))
        readme_command(submit, cwd=Path(folder))


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
    watch_as_readme(name)
    final = finished(name, 60)
    figures["quick start through the operator (s)"] = time.monotonic() - created
    accepted = final.get("acceptedSpec") or {}
    if (accepted.get("image"), (accepted.get("storage") or {}).get("claimName")) != (TRAINER_IMAGE, CLAIM):
        raise Failed(f"status.acceptedSpec does not show the job defaults it ran with: {json.dumps(accepted)[:600]}")
    breakdown = (final.get("progress") or {}).get("stepBreakdown") or {}
    if not str(breakdown.get("bottleneck") or "").startswith("rank ") or len(breakdown.get("ranks") or []) != 2:
        raise Failed(f"status.progress.stepBreakdown names no bottleneck of the 2 ranks: {json.dumps(breakdown)[:600]}")
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
    results_as_readme(name)
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


def scenario_suspend_resume(figures: Figures) -> None:
    name = "e2e-suspend"
    apply(small_job(name))
    eventually(lambda: checkpoint_step(name) >= 8, f"{name}: a checkpoint at step 8 or later", 300)
    kubectl("patch", "dtr", name, "-n", NS, "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}')
    suspended = time.monotonic()
    eventually(lambda: status(name).get("phase") == "Suspended", f"{name} Suspended", 60)
    eventually(lambda: not worker_pods(name), f"{name}: every worker pod gone", 90)
    figures["suspend → every pod gone (s)"] = time.monotonic() - suspended
    # The SIGTERM checkpoint's record goes with the operator's write of the pods gone (it carries rank 0's pending
    # records): read it once the status says so, not at the moment the pods go.
    eventually(lambda: not any((status(name).get("nodes") or {}).get(state) for state in ("running", "pending")),
               f"{name}: the status counts no pod running", 30)
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
    eventually(lambda: logged_step(name) >= 2, f"{name}: training", 300)
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
