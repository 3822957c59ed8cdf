"""A worker's failures and the restarts they lead to: a training process killed (in place or recreated,
on a claim or s3://), the network cut, a hang, a straggler, a wrong interface."""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from typing import Any

import yaml
from localcluster import layout

from dtrain_operator.api import contract

from ..kube import (
    Failed,
    apply,
    eventually,
    kill,
    kubectl,
    link,
    status,
    throttle,
    trainer_pids,
    worker_pods,
)
from .common import (
    CLAIM,
    NS,
    SMALL_JOB,
    TRAINING_TIMEOUT,
    Figures,
    checkpoint_step,
    condition,
    delete,
    events,
    finished,
    logged_step,
    pod,
    running_gang,
    small_job,
)
from .jobs import quickstart_job, submit_as_readme


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
    # 4 epochs of 6 steps; killed just after rank 0 logs the first epoch's end (step 6): mid-epoch.
    trainer = {**yaml.safe_load(SMALL_JOB.read_text())["spec"]["trainer"], "maxEpochs": 4}
    apply(small_job(name, trainer=trainer, runPolicy={"backoffLimit": 3, "restartStrategy": strategy}))
    eventually(lambda: logged_step(name) >= 6, f"{name}: step 6 logged", 300, every=0.25)
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
        # A batch completed by the new gang's rank 0 (written at once), whatever stage its latest report shows:
        # a short gang may be validating, checkpointing or finishing whenever the status is written.
        return progress.get("gangGeneration") == 1 and int(progress.get("batches") or 0) > 0

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
        how = "in place, in the same pods" if same else "by recreating its pods"
        if not any(how in e["message"] for e in events(f"e2e-restart-{measured.strategy.lower()}", "Restarting")):
            raise Failed(f"{measured.strategy}: no Restarting Event that says {how!r}")
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
    submit_as_readme(job)
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
    eventually(lambda: logged_step(name) >= 8, f"{name}: training", 300)
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
