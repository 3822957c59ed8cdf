"""The operator and the control plane failing under a training job: the operator's process killed, its
leader lost, kube-apiserver and etcd stopped."""

from __future__ import annotations

import subprocess
import time

import yaml
from localcluster import controlplane, layout, processes

from ..kube import (
    REPO,
    Failed,
    apply,
    eventually,
    kill,
    kubectl,
    pod_processes,
    status,
    worker_pods,
)
from .common import (
    NS,
    SMALL_JOB,
    Figures,
    delete,
    finished,
    lease_holder,
    logged_step,
    operator_pods,
    progress_step,
    small_job,
)


def scenario_operator_killed(figures: Figures) -> None:
    """The operator's process SIGKILLed mid-training: its container restarts (the kubelet), nothing is created twice."""
    name = "e2e-opkill"
    apply(small_job(name))
    eventually(lambda: logged_step(name) >= 4, f"{name}: training", 300)
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
        eventually(lambda: logged_step(name) >= 4, f"{name}: training", 300)
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
