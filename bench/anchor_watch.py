"""What bench/anchors.py measures with: the training's progress as each system reports it, what a user sees,
the disruptions (a worker killed, a node lost, a rank stopped) and the API server's audit log."""

from __future__ import annotations

import json
import math
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.anchor_jobs import System
from dtrain_operator.api.records import Event
from tests.cluster.kube import (
    Failed,
    eventually,
    items,
    kill,
    kubectl,
    localcluster,
    pod_processes,
    trainer_pids,
)
from tests.cluster.scenarios.common import NS, lease_holder

from localcluster import anchors, controllers, layout, processes  # isort: skip  (tests.cluster puts tools/cluster on the path)

POLL_SECONDS = 0.5


def timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# --- Watching the training ---------------------------------------------------------------------


# What rank 0's dtrain pod logs (kubectl logs --timestamps): each gang generation its supervisor starts, in a new
# pod (a recreate) or in the same one (an in-place restart), and the checkpoint its trainer resumed from.
# The trainer's start line (its START record, which the anchors' trainers write to their records file): after its
# imports and the pre-flight, as for the anchors; the supervisor's own line comes seconds before it.
GANG_START = re.compile(r"dtrain: training \S+: \d+ node")
RESUMED = re.compile(r"resumed from \S+ at step (\d+)")
KUBECTL_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) ")  # RFC 3339, as `kubectl logs --timestamps`


def dtrain_log_events(lines: list[str], seen_at: float) -> tuple[list[float], list[tuple[float, int]]]:
    """The gang starts (times) and resumes (time, step) in log lines read for the first time at `seen_at`: each at
    its `kubectl logs --timestamps` time where the kubelet gives one, else at the second `seen_at` falls in (make
    cluster's kubelet keeps no times: within a poll of the truth, and to the second as the trainer's records)."""
    starts: list[float] = []
    resumes: list[tuple[float, int]] = []
    for line in lines:
        stamped = KUBECTL_TIMESTAMP.match(line)
        moment = timestamp(stamped[1]) if stamped else float(math.floor(seen_at))
        if GANG_START.search(line):
            starts.append(moment)
        elif found := RESUMED.search(line):
            resumes.append((moment, int(found[1])))
    return starts, resumes


@dataclass
class Progress:
    """What the training reported, by the trainer's own clock: its steps (time, step), its starts (rank 0's
    trainer coming up; dtrain's in the same pod too) and the steps it resumed from (time, step)."""

    system: System
    name: str
    records: Path
    _offset: int = 0
    steps: list[tuple[float, int]] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    resumes: list[tuple[float, int]] = field(default_factory=list)
    _log_lines_read: dict[str, int] = field(default_factory=dict)  # rank 0's pod (uid) -> the log lines read
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
        """dtrain's status.progress (updatedAt is the record's own time); its starts and resumes from the lines of
        rank 0's log that the last poll had not read (dtrain_log_events)."""
        progress = self.system.status(self.name).get("progress") or {}
        if progress.get("updatedAt") and progress.get("step"):
            point = (timestamp(progress["updatedAt"]), int(progress["step"]))
            if not self.steps or point != self.steps[-1]:
                self.steps.append(point)
        pod = self.system.rank_pods(self.name).get(0)
        if pod is None or pod.get("status", {}).get("phase") != "Running":
            return
        uid, seen_at = pod["metadata"]["uid"], time.time()
        lines = kubectl("logs", pod["metadata"]["name"], "-n", NS, "--timestamps", check=False).stdout.splitlines()
        read = self._log_lines_read.get(uid, 0)
        self._log_lines_read[uid] = len(lines)
        starts, resumes = dtrain_log_events(lines[read:], seen_at)
        self.starts.extend(starts)
        self.resumes.extend(resumes)

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
        """The first step at or after `moment`: the trainers stamp their records to the second, so the first step
        of a restarted gang may fall in the second of its start."""
        return self._wait(lambda: next((p for p in self.steps if p[0] >= moment), None), timeout)

    def start_after(self, moment: float, timeout: float) -> float | None:
        """The first start of rank 0's trainer after `moment`: the gang restarted."""
        return self._wait(lambda: next((t for t in self.starts if t > moment), None), timeout)

    def resumed_after(self, moment: float, timeout: float = 30) -> int | None:
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
    # Only the controllers installed (`--systems dtrain` needs none of the anchors').
    installed = {namespace for namespace in CONTROLLERS if items("deployments", namespace)}
    for namespace in installed:
        kubectl("rollout", "status", f"deploy/{CONTROLLERS[namespace]}", "-n", namespace, "--timeout=180s")
    for anchor in (a for a in anchors.ANCHORS if a.namespace in installed):
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


def request_name(event: dict[str, Any]) -> str:
    """One audit event as `verb resource[/subresource]`, a dry run said so: `patch distributedtrainings/status`."""
    ref = event.get("objectRef") or {}
    resource = "/".join(part for part in (ref.get("resource"), ref.get("subresource")) if part)
    dry = " (dry run)" if "dryRun=" in event.get("requestURI", "") else ""
    return f"{event['verb']} {resource}{dry}"


def audit_requests(start: float, end: float) -> Counter[tuple[str, str]]:
    """Requests in the benchmark's namespace between two moments, by user and request_name (not the benchmark's
    own: the admin)."""
    counted: Counter[tuple[str, str]] = Counter()
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
            counted[user, request_name(event)] += 1
    return counted


