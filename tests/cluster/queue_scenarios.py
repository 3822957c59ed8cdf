"""Kueue on the real control plane (installed in the running cluster: `localcluster kueue`): a job in a
LocalQueue is admitted as one gang against a ClusterQueue's quota, waits Queued while the quota is taken,
and, preempted by a higher-priority job, saves its checkpoint, waits, and resumes exactly from it (its final
weights are those of the same job never interrupted)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import torch
from localcluster import layout

from .kube import Failed, apply, eventually, kubectl, localcluster, status, worker_pods
from .scenarios.common import CLAIM, NS, Figures, checkpoint_step, delete, finished, small_job

LOCAL_QUEUE = "e2e"
CLUSTER_QUEUE = "e2e-gpus"
FLAVOR = "e2e-nodes"
GPU = "nvidia.com/gpu"
# Room for one job of 2 workers with one nvidia.com/gpu each (the e2e cluster has 2 such nodes).
GPU_QUOTA = 2


def with_kueue() -> None:
    """Kueue in the running cluster (`localcluster kueue`: built and installed the first time), and the
    scenarios' queues."""
    if localcluster("kueue") != 0:
        raise Failed("Kueue did not start (above)")
    for obj in queue_objects():
        apply(obj)


def queue_objects() -> list[dict[str, Any]]:
    """A ResourceFlavor, a ClusterQueue with room for one 2-GPU gang (lower priority preempted within it), its
    LocalQueue in the scenarios' namespace, and two WorkloadPriorityClasses."""
    api = "kueue.x-k8s.io/v1beta2"
    quotas = [{"name": "cpu", "nominalQuota": "64"}, {"name": "memory", "nominalQuota": "256Gi"},
              {"name": GPU, "nominalQuota": str(GPU_QUOTA)}]
    return [
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
        {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
         "spec": {"namespaceSelector": {},
                  "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory", GPU],
                                      "flavors": [{"name": FLAVOR, "resources": quotas}]}]}},
        {"apiVersion": api, "kind": "LocalQueue", "metadata": {"name": LOCAL_QUEUE, "namespace": NS},
         "spec": {"clusterQueue": CLUSTER_QUEUE}},
        {"apiVersion": api, "kind": "WorkloadPriorityClass", "metadata": {"name": "e2e-low"}, "value": 100},
        {"apiVersion": api, "kind": "WorkloadPriorityClass", "metadata": {"name": "e2e-high"}, "value": 1000},
    ]


def queued_job(name: str, priority: str | None = None, **spec: Any) -> dict[str, Any]:
    """The small job on 2 workers of one nvidia.com/gpu each, in the LocalQueue (and a priority class)."""
    job = small_job(name, accelerator="gpu", devicesPerNode=1, terminationGracePeriodSeconds=30, **spec)
    labels = {"kueue.x-k8s.io/queue-name": LOCAL_QUEUE}
    if priority:
        labels["kueue.x-k8s.io/priority-class"] = priority
    job["metadata"]["labels"] = labels
    return job


def bound(name: str) -> list[str]:
    return [p["metadata"]["name"] for p in worker_pods(name) if p["spec"].get("nodeName")]


def newest_rank_0(name: str) -> str:
    """The pod of rank 0 of the job's newest gang."""
    pods = [p for p in worker_pods(name) if p["metadata"]["labels"].get("dtrain.dev/node-rank") == "0"]
    if not pods:
        return f"{name}-0"
    return max(pods, key=lambda p: int(p["metadata"]["labels"].get("dtrain.dev/gang-generation", "0")))["metadata"]["name"]


def queued_condition(name: str) -> dict[str, Any]:
    return next((c for c in status(name).get("conditions") or [] if c["type"] == "Queued"), {})


def get_dtr(name: str) -> str:
    return kubectl("get", "dtr", name, "-n", NS).stdout.strip()


def kueue_served() -> bool:
    return kubectl("get", "crd", "localqueues.kueue.x-k8s.io", check=False).returncode == 0


def not_honored_while_kueue_is_missing() -> None:
    """Before Kueue runs, a job that names a queue gets QueueNotHonored (a Warning) and no pod of it is bound:
    its workers wait behind the admission gate instead of running unqueued."""
    name = "e2e-kq-unqueued"
    apply(queued_job(name))
    condition = eventually(lambda: next((c for c in status(name).get("conditions") or []
                                         if c["type"] == "QueueNotHonored" and c["status"] == "True"), None),
                           f"{name}: the QueueNotHonored condition", 120)
    warned = kubectl("get", "events", "-n", NS, "--field-selector", f"involvedObject.name={name},reason=QueueNotHonored",
                     "-o", "name").stdout.strip()
    if not warned or bound(name):
        raise Failed(f"{name}: Warning Event {warned!r}, pods bound {bound(name)}; expected an Event and none bound")
    print(f"without Kueue: {condition['message'][:200]}", flush=True)
    kubectl("delete", "dtr", name, "-n", NS, "--wait=true", "--timeout=120s")


def scenario_kueue_quota(figures: Figures) -> None:
    """Two jobs for a quota of one: the second is Queued, none of its pods bound, until the first ends."""
    if not kueue_served():
        not_honored_while_kueue_is_missing()
    with_kueue()
    first, second = "e2e-kq-first", "e2e-kq-second"
    apply(queued_job(first))
    eventually(lambda: status(first).get("phase") == "Running", f"{first} admitted and Running", 300)
    apply(queued_job(second))
    eventually(lambda: status(second).get("phase") == "Queued", f"{second} Queued", 120)
    message = queued_condition(second).get("message", "")
    if CLUSTER_QUEUE not in message or LOCAL_QUEUE not in message:
        raise Failed(f"{second}'s Queued condition does not name its queues: {message!r}")
    print(f"while queued:\n{get_dtr(second)}\n  Queued: {message}", flush=True)
    while status(first).get("phase") not in ("Succeeded", "Failed"):
        if bound(second):
            raise Failed(f"{second} has pods bound while {first} holds the quota: {bound(second)}")
        time.sleep(2)
    finished(first)
    freed = time.monotonic()
    eventually(lambda: status(second).get("phase") == "Running", f"{second} admitted once {first} ended", 300)
    figures["Kueue: quota freed → queued job Running (s)"] = time.monotonic() - freed
    final = finished(second)
    if final.get("restarts") or final.get("evictions"):
        raise Failed(f"{second}: restarts {final.get('restarts')}, evictions {final.get('evictions')}; expected none")
    delete(first)
    delete(second)


def scenario_kueue_failed_frees_the_queue(figures: Figures) -> None:
    """A queued job that fails at start lets go of its queue: Kueue finishes its Workload, and the next job of the
    queue is admitted within a minute and Succeeds."""
    with_kueue()
    failing, second = "e2e-kf-failing", "e2e-kf-second"
    apply(queued_job(failing, model={"classPath": "e2e_no_such_module.Model"}))
    final = eventually(lambda: status(failing).get("phase") in ("Failed", "Succeeded") and status(failing),
                       f"{failing} to fail", 300)
    if final["phase"] != "Failed":
        raise Failed(f"{failing} should fail at start (no such model class): {final['phase']}")
    failed_at = time.monotonic()
    apply(queued_job(second))
    eventually(lambda: status(second).get("phase") == "Running", f"{second} admitted once {failing} failed", 60)
    figures["Kueue: a queued job failed → the next one Running (s)"] = time.monotonic() - failed_at
    # Kueue says so on the group's pods (its Workload may be gone by now, with nothing left to hold).
    declared = kubectl("get", "events", "-n", NS, "--field-selector", "reason=FinishedWorkload", "-o", "json").stdout
    if f"Workload '{NS}/{failing}' is declared finished" not in declared:
        raise Failed(f"Kueue never declared {failing}'s Workload finished")
    finished(second)
    delete(failing)
    delete(second)
    # Kueue lifted its finalizers: the pods go with their jobs (a namespace of ended jobs deletes, none hangs).
    eventually(lambda: not worker_pods(failing) and not worker_pods(second), "the ended jobs' pods gone", 60)


def scenario_kueue_preemption(figures: Figures) -> None:
    """A higher-priority job preempts a running one: its workers checkpoint on SIGTERM, it waits Queued (an
    eviction, not a restart), and resumes exactly from that checkpoint once admitted again."""
    with_kueue()
    low, high = "e2e-kp-low", "e2e-kp-high"
    apply(queued_job(low, "e2e-low"))
    eventually(lambda: checkpoint_step(low) >= 8, f"{low}: a checkpoint at step 8 or later", 300)
    apply(queued_job(high, "e2e-high"))
    preempted = time.monotonic()
    eventually(lambda: (status(low).get("evictions") or 0) >= 1, f"{low} evicted by Kueue", 120)
    eventually(lambda: not worker_pods(low) or all(not p["spec"].get("nodeName") for p in worker_pods(low)),
               f"{low}: its gang gone or queued", 120)
    kept = checkpoint_step(low)
    eventually(lambda: status(high).get("phase") == "Running", f"{high} Running", 300)
    figures["Kueue: higher priority submitted → it runs (s)"] = time.monotonic() - preempted
    eventually(lambda: status(low).get("phase") == "Queued", f"{low} Queued again", 120)
    print(f"preempted:\n{get_dtr(low)}\n  {queued_condition(low).get('message', '')}", flush=True)
    finished(high)
    # The gang Kueue admits again is a new generation of pods, named after it (<name>-<rank>-g<generation>).
    logs = eventually(lambda: (text := kubectl("logs", newest_rank_0(low), "-n", NS, check=False).stdout)
                      and "resumed from" in text and text, f"{low}: resumed", 300)
    resumed = int(re.search(r"resumed from \S+ at step (\d+)", logs).group(1))
    print(f"admitted again:\n{get_dtr(low)}", flush=True)
    if resumed != kept:
        raise Failed(f"{low} resumed at step {resumed}; its last checkpoint (saved on SIGTERM) was at step {kept}")
    final = finished(low)
    if final.get("restarts"):
        raise Failed(f"{low}: restarts {final['restarts']}; a preemption must count none")
    # Exact resume across the preemption: the same job, never interrupted, ends with the same weights.
    whole = "e2e-kp-whole"
    apply(queued_job(whole, "e2e-low"))
    finished(whole)
    preempted, uninterrupted = final_weights(low), final_weights(whole)
    if preempted.keys() != uninterrupted.keys():
        raise Failed(f"{low} and {whole} have different parameters")
    differ = [k for k in preempted if not torch.allclose(preempted[k], uninterrupted[k], rtol=1e-5, atol=1e-6)]
    if differ:
        raise Failed(f"{low}'s final weights differ from an uninterrupted run's: {differ[:5]}")
    for name in (low, high, whole):
        delete(name)


def final_weights(name: str) -> dict[str, Any]:
    """The job's last checkpoint's weights, read from the scenarios' claim (a folder on this machine)."""
    path = layout.VOLUMES / NS / CLAIM / name / "checkpoints" / "last.ckpt"
    return dict(torch.load(path, map_location="cpu", weights_only=False)["state_dict"])


QUEUE_SCENARIOS: list[tuple[str, str, Callable[[Figures], None]]] = [
    ("kueue-quota", ("Kueue: before it runs, a job naming a queue says QueueNotHonored and none of its pods is bound; "
                     "a ClusterQueue with room for one 2-GPU gang, two jobs: the second Queued, none of its "
                     "pods bound, until the first ends; then it trains to Succeeded"), scenario_kueue_quota),
    ("kueue-failed", ("Kueue: a queued job that fails at start lets go of its queue: its Workload Finished, the "
                      "next job admitted within a minute and Succeeded"), scenario_kueue_failed_frees_the_queue),
    ("kueue-preemption", ("Kueue: a higher-priority job preempts a running one, which checkpoints on SIGTERM, waits "
                          "Queued (no restart counted) and resumes exactly from that checkpoint"),
     scenario_kueue_preemption),
]
