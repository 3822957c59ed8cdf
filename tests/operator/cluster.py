"""The operator's test bench on the emulated API server (apiserver.py; real_cluster.py is the same bench on
the real one): the operator as a real process (operator_process.py), a kubelet and a Job controller played by
the tests over HTTP, writing statuses as real ones do. Jobs come from tests/builders.py. A DistributedTraining
is stored as sent (no schema, no CEL rules: what the CRD refuses is judged by the real server elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import kmock

from dtrain_operator.api import contract

from .admission_refusals import Refusals
from .apiserver import KUBELET_FINALIZER, ApiServer, now_rfc3339
from .operator_process import OPERATOR_AGENTS, OperatorProcess, write_kubeconfig

DTR = kmock.resource(f"{contract.API_VERSION}/{contract.PLURAL}")
PODS = kmock.resource("v1/pods")
TIMEOUT = 30.0


def container_status(pod: dict[str, Any], state: dict[str, Any], ready: bool) -> list[dict[str, Any]]:
    statuses = []
    for container in pod["spec"]["containers"]:
        image = container["image"]
        statuses.append(
            {
                "name": container["name"],
                "image": image,
                "imageID": f"{image.split(':')[0]}@sha256:{'ab' * 32}",
                "containerID": f"containerd://{'cd' * 32}",
                "ready": ready,
                "started": "running" in state,
                "restartCount": 0,
                "state": state,
            }
        )
    return statuses


class Cluster:
    """The API server plus what a cluster's kubelets and Job controller do, driven over HTTP."""

    def __init__(self, api: ApiServer, tmp: Path) -> None:
        self.api = api
        self.tmp = tmp
        self.kubeconfig = write_kubeconfig(tmp / "kubeconfig", str(api.url).rstrip("/"))
        self.operators: list[OperatorProcess] = []
        self.refusals = Refusals()  # creates the API server refuses, as a real cluster's admission does

    # --- The operator ------------------------------------------------------------------------------

    def operator(self, *args: str, pod_id: str = "dtrain-operator-test") -> OperatorProcess:
        process = OperatorProcess(self.kubeconfig, self.tmp / "operator.log", args, pod_id)
        self.operators.append(process)
        return process

    async def start_operator(self, *args: str, pod_id: str = "dtrain-operator-test") -> OperatorProcess:
        """Start an operator and wait until it watches pods (its indexes are filling)."""
        process = self.operator(*args, pod_id=pod_id)
        watches = self.api.count_calls(OPERATOR_AGENTS, verb="watch", resource="pods")
        process.start()

        def watching() -> bool:
            if not process.running:
                raise AssertionError(f"the operator exited ({process.process.returncode}):\n{process.log_tail()}")
            return self.api.count_calls(OPERATOR_AGENTS, verb="watch", resource="pods") > watches

        await self.eventually(
            watching,
            "the operator never started watching pods",
            timeout=60,
        )
        return process

    def logs(self) -> str:
        return "\n".join(p.log_tail() for p in self.operators[-1:])

    async def eventually(
        self,
        check: Callable[[], Any | Awaitable[Any]],
        what: str | Callable[[], str] = "condition",
        timeout: float = TIMEOUT,
    ) -> Any:
        """Poll `check` until it returns something truthy (and return that); fail with the operator's log."""
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if asyncio.iscoroutine(result):
                result = await result
            if result:
                return result
            if time.monotonic() > deadline:
                what = what() if callable(what) else what
                raise AssertionError(f"timed out after {timeout} s waiting for: {what}\n--- operator log ---\n{self.logs()}")
            await asyncio.sleep(0.05)

    # --- The API, as kubectl -----------------------------------------------------------------------

    async def _request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        headers = {"Content-Type": content_type}
        async with self.api.request(method, path, json=body, headers=headers) as response:
            data = await response.json(content_type=None)
            if response.status >= 300:
                raise AssertionError(f"{method} {path}: {response.status} {data}")
            return data

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        prefix = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
        plural = {"DistributedTraining": contract.PLURAL}.get(obj["kind"], obj["kind"].lower() + "s")
        return await self._request("POST", f"{prefix}/namespaces/{meta.get('namespace', 'default')}/{plural}", obj)

    async def apply(self, job: dict[str, Any]) -> dict[str, Any]:
        return await self.create(job)

    def _dtr_path(self, namespace: str, name: str) -> str:
        return f"/apis/{contract.API_VERSION}/namespaces/{namespace}/{contract.PLURAL}/{name}"

    async def patch_job(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._request("PATCH", self._dtr_path(namespace, name), patch, "application/merge-patch+json")

    async def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """What the trainer does with its service account: patch status.progress."""
        return await self._request(
            "PATCH", self._dtr_path(namespace, name) + "/status", {"status": status}, "application/merge-patch+json"
        )

    async def delete(self, path: str, force: bool = False) -> None:
        """DELETE; `force`: with grace period 0, as the pod GC deletes the pods of a lost node."""
        await self._request("DELETE", path, {"gracePeriodSeconds": 0} if force else None)

    async def patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._request("PATCH", path, patch, "application/merge-patch+json")

    # --- What is stored ----------------------------------------------------------------------------

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        key = (DTR, namespace, name)
        if key not in self.api.objects:
            return None
        obj = self.api.objects[key]
        return None if obj.deleted else dict(obj.last.raw)

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        job = self.job(namespace, name)
        return (job or {}).get("status") or {}

    def condition(self, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
        return next((c for c in self.status(namespace, name).get("conditions", []) if c["type"] == type_), None)

    def objects(self, resource: str, namespace: str | None = None, job: str | None = None) -> list[dict[str, Any]]:
        found = []
        for (res, ns, _), obj in self.api.objects.items():
            if obj.deleted or res != kmock.resource(resource) or (namespace is not None and ns != namespace):
                continue
            raw = dict(obj.last.raw)
            labels = raw["metadata"].get("labels") or {}
            if job is None or labels.get(contract.LABEL_JOB_NAME) == job:
                found.append(raw)
        return found

    def pods(self, namespace: str, job: str, role: str = contract.ROLE_WORKER) -> list[dict[str, Any]]:
        pods = [
            p for p in self.objects("v1/pods", namespace, job) if p["metadata"]["labels"].get(contract.LABEL_ROLE) == role
        ]
        return sorted(pods, key=lambda p: p["metadata"]["name"])

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        obj = self.api.objects[PODS, namespace, name]
        return dict(obj.last.raw)

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return sorted(
            (e for e in self.objects("v1/events", namespace) if e["involvedObject"]["name"] == name),
            key=lambda e: int(e["metadata"]["resourceVersion"]),
        )

    async def event_reasons(self, namespace: str, name: str, reasons: list[str]) -> list[dict[str, Any]]:
        """Wait until the job's Events have exactly these reasons, in order (they follow status patches)."""
        await self.eventually(
            lambda: [e["reason"] for e in self.events(namespace, name)] == reasons,
            f"events {reasons} (got {[e['reason'] for e in self.events(namespace, name)]})",
        )
        return self.events(namespace, name)

    def pod_creations(self, namespace: str, name: str) -> int:
        """How many times a pod of this name was created (each incarnation has its own uid)."""
        key = (PODS, namespace, name)
        if key not in self.api.objects:
            return 0
        return len({v["metadata"]["uid"] for v in self.api.objects[key].history if v is not None})

    def job_versions(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Every version of the job that was stored, oldest first."""
        return [dict(v) for v in self.api.objects[DTR, namespace, name].history if v is not None]

    def deletion_grace(self, namespace: str, name: str) -> int | None:
        """The grace period the pod was deleted with (None while it was not)."""
        return self.api.deletion_graces.get((namespace, name))

    async def stop_operators(self) -> None:
        for process in self.operators:
            if process.running:
                # In a thread: the emulator runs in this loop, and a stopping operator releases its Lease.
                await asyncio.to_thread(process.stop)

    # --- The kubelet and the Job controller ----------------------------------------------------------

    async def hold_termination(self, namespace: str, name: str) -> None:
        """From now on, deleting the pod leaves it Terminating until `let_go` (a kubelet confirming)."""
        await self.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": {"finalizers": [KUBELET_FINALIZER]}})

    async def let_go(self, namespace: str, name: str) -> None:
        """The kubelet confirms a held pod's termination: the pod goes."""
        await self.patch(f"/api/v1/namespaces/{namespace}/pods/{name}", {"metadata": {"finalizers": None}})

    async def _pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self._request(
            "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status}, "application/merge-patch+json"
        )

    async def schedule(self, namespace: str, name: str) -> None:
        await self._pod_status(
            namespace,
            name,
            {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}]},
        )

    async def bind(self, namespace: str, name: str, node: str) -> None:
        """What the scheduler's binding sets: the node the pod runs on (spec.nodeName)."""
        await self._request(
            "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}", {"spec": {"nodeName": node}}, "application/merge-patch+json"
        )

    async def unschedulable(self, namespace: str, name: str, message: str) -> None:
        await self._pod_status(
            namespace,
            name,
            {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                     "lastTransitionTime": now_rfc3339()}
                ],
            },
        )

    async def run(self, namespace: str, name: str, node: str | None = None) -> None:
        """Running (on `node`, bound after the status, so that the operator sees no Starting in between)."""
        pod = self.pod(namespace, name)
        now = now_rfc3339()
        await self._pod_status(
            namespace,
            name,
            {
                "phase": "Running",
                "hostIP": "10.0.0.1",
                "podIP": "10.1.0.1",
                "startTime": now,
                "conditions": [
                    {"type": t, "status": "True", "lastTransitionTime": now}
                    for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
                ],
                "containerStatuses": container_status(pod, {"running": {"startedAt": now}}, ready=True),
            },
        )
        if node:
            await self.bind(namespace, name, node)

    async def run_all(self, namespace: str, job: str, nodes: int, on: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Wait for the job's `nodes` worker pods and start them all (pod i on node `on[i]`, if given)."""
        pods = await self.eventually(
            lambda: (p := self.pods(namespace, job)) and len(p) == nodes and p, f"{nodes} worker pods of {job}"
        )
        for index, pod in enumerate(pods):
            await self.run(namespace, pod["metadata"]["name"], on[index] if on else None)
        return pods

    async def exit(self, namespace: str, name: str, code: int, message: str = "", reason: str = "") -> None:
        pod = self.pod(namespace, name)
        now = now_rfc3339()
        terminated = {
            "exitCode": code,
            "reason": reason or ("Completed" if code == 0 else "Error"),
            "startedAt": now,
            "finishedAt": now,
            "containerID": f"containerd://{'cd' * 32}",
        }
        if message:
            terminated["message"] = message
        await self._pod_status(
            namespace,
            name,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}],
                "containerStatuses": container_status(pod, {"terminated": terminated}, ready=False),
            },
        )

    async def evict(self, namespace: str, name: str) -> None:
        pod = self.pod(namespace, name)
        now = now_rfc3339()
        terminated = {"exitCode": 137, "reason": "ContainerStatusUnknown", "startedAt": now, "finishedAt": now}
        await self._pod_status(
            namespace,
            name,
            {
                "phase": "Failed",
                "reason": "Evicted",
                "message": "The node was low on resource: memory.",
                "conditions": [
                    {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                     "message": "The node was low on resource: memory.", "lastTransitionTime": now}
                ],
                "containerStatuses": container_status(pod, {"terminated": terminated}, ready=False),
            },
        )

    async def finish_engine_job(self, namespace: str, job: str, succeeded: bool, message: str = "") -> None:
        """The Job controller's part: one pod for the engine Job, which exits; then the Job's status."""
        engine = await self.eventually(
            lambda: next(iter(self.objects("batch/v1/jobs", namespace, job)), None), f"the engine Job of {job}"
        )
        meta = engine["metadata"]
        template = engine["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-x7k2p",
                "namespace": namespace,
                "labels": {**template["metadata"]["labels"], "batch.kubernetes.io/job-name": meta["name"]},
                "ownerReferences": [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"],
                     "controller": True, "blockOwnerDeletion": True}
                ],
            },
            "spec": template["spec"],
        }
        await self.create(pod)
        await self.run(namespace, pod["metadata"]["name"])
        await self.exit(namespace, pod["metadata"]["name"], 0 if succeeded else 1, message)
        now = now_rfc3339()
        if succeeded:
            status = {
                "startTime": now,
                "succeeded": 1,
                "completionTime": now,
                "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                    {"type": "Complete", "status": "True", "lastTransitionTime": now},
                ],
            }
        else:
            status = {
                "startTime": now,
                "failed": 1,
                "conditions": [
                    {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit", "lastTransitionTime": now},
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit", "lastTransitionTime": now},
                ],
            }
        await self._request(
            "PATCH", f"/apis/batch/v1/namespaces/{namespace}/jobs/{meta['name']}/status", {"status": status},
            "application/merge-patch+json",
        )

    # --- Common waits ---------------------------------------------------------------------------------

    async def phase(self, namespace: str, name: str, phase: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        return await self.eventually(
            lambda: (s := self.status(namespace, name)).get("phase") == phase and s,
            f"{namespace}/{name} in phase {phase} (it is {self.status(namespace, name).get('phase')})",
            timeout,
        )


@contextlib.asynccontextmanager
async def running_cluster(tmp: Path):
    """An API server on a local port, with the resources declared and a namespace or two."""
    async with ApiServer() as api, kmock.Server(api):
        api.declare_resources()
        cluster = Cluster(api, tmp)
        api.admission.append(cluster.refusals.hook)
        try:
            yield cluster
        finally:
            await cluster.stop_operators()
            api.faults.clear()
