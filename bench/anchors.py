"""dtrain against its anchors in one run, on one cluster: JobSet, Kubeflow Trainer v2 (TrainJob) and the
Training Operator's PyTorchJob, each from its own controller, measured side by side (`make bench-anchors`).

Needs `make cluster` running (root, network namespaces); `make bench-anchors` installs the anchors first
(`python -m localcluster anchors`: each controller built unmodified from its Go module, tools/cluster/anchors).

The same training under each: examples/quickstart.yaml's model and data, 2 nodes of one CPU process, the
trainer image make cluster built, the same trainer config (the files dtrain renders into the job's pods, from a
ConfigMap mounted at the same path), the same steps and checkpoint interval, on the same claim. The trainer
resumes from the last checkpoint it finds by itself, so each anchor gets resume as dtrain does: what differs is the
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

Before the first system, one untimed pod of the trainer image imports the trainer, so that the system measured
first does not pay a cold page cache alone. Scenarios, each under each system, one at a time (the hangs of the
anchors run together: each waits for the collective timeout, capped):

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
for the anchors from the same records written to a file on the claim (they have no status for it). A restart
is rank 0's trainer starting again (its START record, after its imports and the pre-flight): for dtrain its start
line in a new pod or in the same one (an in-place restart keeps the pods), as its log says.
Steps lost: the highest step seen before the restart less the step the restarted gang resumed from (rank 0's
"resumed from ... at step N"), never below 0 (a survivor's checkpoint may be newer than any report).

The systems' job definitions are in bench/anchor_jobs.py; the watching, disruptions and audit log in
bench/anchor_watch.py; the scenarios, table and command here.

`python -m bench.anchors [--systems dtrain,jobset,trainjob,pytorchjob] [--hang-cap-seconds 900]`
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from typing import Any

from bench.anchor_jobs import System, Workload, systems
from bench.anchor_watch import (
    Progress,
    _rank_pod,
    audit_requests,
    evacuate_controllers,
    join_node,
    kill_worker,
    lose_node,
    snapshot,
    stop_rank_1,
)
from bench.common import machine, markdown_table, write_results
from dtrain_operator.api import contract
from tests.cluster.kube import (
    Failed,
    apply,
    eventually,
    get,
    items,
    kubectl,
    localcluster,
)
from tests.cluster.scenarios.common import CLAIM, NS

RESULTS = "anchors"
STEPS_BEFORE_DISRUPTION = 12  # training steps after a (re)start before the next disruption
START_TIMEOUT = 600.0
RECOVERY_TIMEOUT = 600.0
HANG_CAP_SECONDS = 900.0


# --- One system through the scenarios ----------------------------------------------------------


def warm_up() -> None:
    """One untimed pod of the trainer image that imports the trainer, before the first system: the nodes share this
    machine's page cache, and a cold one cost the system measured first about 2.5 s of its start (torch and
    Lightning read from disk), whichever system it was."""
    workload = Workload.of("anchors-warm-up")
    template = workload.pod_template("warm-up", "Never", command=[
        "python", "-c", "import torch.distributed, lightning.pytorch, dtrain_trainer.runner"])
    apply(workload.config_map)
    apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "anchors-warm-up", "namespace": NS}, **template})
    try:
        phase = eventually(lambda: (p := ((get("pod", "anchors-warm-up", NS) or {}).get("status") or {}).get("phase"))
                           in ("Succeeded", "Failed") and p, "the warm-up pod done", 300)
        if phase != "Succeeded":
            raise Failed(f"the warm-up pod {phase}: {kubectl('logs', 'anchors-warm-up', '-n', NS, check=False).stdout[-800:]}")
    finally:
        kubectl("delete", "pod", "anchors-warm-up", "-n", NS, "--wait=false", check=False)
        kubectl("delete", "configmap", workload.config_map["metadata"]["name"], "-n", NS, "--wait=false", check=False)


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
    # The highest step seen before the restart; a survivor's checkpoint may be newer than any report: none lost.
    reached = max([before[1], *(step for moment, step in progress.steps if moment <= restarted)])
    return {"restarted_s": round(restarted - disrupted, 1), "training_again_s": round(again[0] - disrupted, 1),
            "step_before": reached, "resumed_from": resumed,
            "steps_lost": max(0, reached - resumed) if resumed is not None else None, "restarts": system.restarts(name)}


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


def api_summary(system: System, counted: Counter[tuple[str, str]]) -> dict[str, Any]:
    """The requests of the system's controller and of Kubernetes' own, and where the controller's go."""
    own: Counter[str] = Counter()
    by_user: Counter[str] = Counter()
    for (user, request), n in counted.items():
        by_user[user] += n
        if user.startswith(system.controller_users):
            own[request] += n
    kubernetes = sum(n for user, n in by_user.items() if user.startswith(("system:serviceaccount:kube-system:",
                                                                           "system:kube-scheduler")))
    return {"controller": sum(own.values()), "kubernetes_controllers": kubernetes,
            "controller_requests": dict(own.most_common()), "by_user": dict(by_user.most_common())}


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
    warm_up()
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
    for result in results.values():
        requests = (result.get("api_requests") or {}).get("controller_requests") or {}
        text += f"\n\n{result['system']}'s controller: " + ", ".join(f"{n} {what}" for what, n in requests.items())
    print(f"\ndtrain and its anchors on Kubernetes {server} ({time.strftime('%Y-%m-%d')}, "
          f"{time.monotonic() - started:.0f} s):\n\n{text}")
    path = write_results(RESULTS, {"kubernetes": server, "machine": machine(), "hang_cap_seconds": args.hang_cap_seconds,
                                   "systems": results, "table": text}, args.out)
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
