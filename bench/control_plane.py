"""The real API server for bench/operator_scale.py: upstream etcd and kube-apiserver only, started by
tests/control_plane.py as for the operator's tests. No scheduler, no controller manager, no kubelet:
the benchmark plays the kubelet with the admin's credentials.

A real server cannot be intercepted as the emulator is, and its `apiserver_request_total` metric
has no user or user-agent label; so the benchmark counts in kube-apiserver's audit log (which
localcluster always writes: level Metadata, verb, resource, user agent, one line per request and stage), and the benchmark counts the operator's
requests there by user agent, as the emulator's recorder does. The moments objects arrive come
from watches the benchmark holds, as a client sees them (creationTimestamp has 1 s resolution).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from typing_extensions import Self

from dtrain_operator.api import contract, crd
from tests.control_plane import COMPONENTS, AuditLog, ControlPlane
from tests.operator.apiserver import now_rfc3339
from tests.operator.cluster import container_status
from tests.operator.operator_process import OPERATOR_AGENTS, OPERATOR_NAMESPACE, OperatorProcess


class RealApi:
    """What the benchmark needs of the API server under test, from a real one: create jobs, play the
    kubelet, and know when objects arrived and which requests the operator made."""

    kind = "real"

    def __init__(self, plane: ControlPlane, workdir: Path, namespaces: tuple[str, ...]) -> None:
        self.plane = plane
        self.workdir = workdir
        self.namespaces = namespaces
        self.label = "kube-apiserver and etcd"
        self.added_at: dict[tuple[str, str | None, str], float] = {}
        self.phase_at: dict[tuple[str | None, str, str], float] = {}
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._audit = AuditLog(Path(plane.audit_log))
        self._session: aiohttp.ClientSession | None = None
        self._watches: list[asyncio.Task[None]] = []
        self.watch_restarts = 0  # the benchmark's watches, ended by the server and resumed
        self.job_events = 0  # events of jobs and pods on the benchmark's watches
        self._cpu_at_start: dict[str, float] = {}

    async def __aenter__(self) -> Self:
        context = ssl.create_default_context(cafile=str(self.plane.ca))
        context.load_cert_chain(str(self.plane.admin_cert), str(self.plane.admin_key))
        self._session = aiohttp.ClientSession(
            self.plane.url, connector=aiohttp.TCPConnector(ssl=context, limit=200), read_bufsize=2**20,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
        )
        try:
            version = await self._request("GET", "/version")
            self.label = f"kube-apiserver {version['gitVersion']} and etcd (upstream, tools/cluster/controlplane)"
            await self._install()
            await self._watch(f"/apis/{contract.API_VERSION}/{contract.PLURAL}", self._on_job)
            await self._watch(f"/api/v1/pods?labelSelector={contract.LABEL_ROLE}%3D{contract.ROLE_WORKER}",
                              self._on_pod)
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *_: object) -> None:
        for watch in self._watches:
            watch.cancel()
        await asyncio.gather(*self._watches, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        assert self._session is not None
        async with self._session.request(method, path, json=body, headers={"Content-Type": content_type}) as reply:
            text = await reply.text()
            if reply.status >= 300:
                raise RuntimeError(f"{method} {path}: {reply.status} {text[:500]}")
            return json.loads(text)

    async def _install(self) -> None:
        """The CRD (as `dtrain crd` prints it), the jobs' namespaces with the workers' service account
        (no controller manager makes it), and the operator's own namespace for its Lease."""
        await self._request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd.crd())
        for namespace in (*self.namespaces, OPERATOR_NAMESPACE):
            await self._request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                               "metadata": {"name": namespace}})
        for namespace in self.namespaces:
            await self._request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {
                "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": contract.DEFAULT_WORKER_SERVICE_ACCOUNT, "namespace": namespace},
            })
        deadline = time.monotonic() + 60
        while True:  # served once Established
            try:
                await self._request("GET", f"/apis/{contract.API_VERSION}/{contract.PLURAL}")
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _watch(self, path: str, on_event: Callable[[str, dict[str, Any], float], None]) -> None:
        """Follow `path` as an informer does: list, then watch from the list's resourceVersion. Returns
        once the server has started the watch (it sends its headers at once)."""
        version = await self._list(path, on_event)
        reply = await self._open_watch(path, version)
        self._watches.append(asyncio.create_task(self._follow(path, reply, version, on_event), name=f"watch {path}"))

    async def _list(self, path: str, on_event: Callable[[str, dict[str, Any], float], None]) -> str:
        listed = await self._request("GET", path)
        now = time.monotonic()
        for item in listed["items"]:
            on_event("ADDED", item, now)  # seen now, unless a watch saw it earlier
        return str(listed["metadata"]["resourceVersion"])

    async def _open_watch(self, path: str, version: str) -> aiohttp.ClientResponse:
        assert self._session is not None
        separator = "&" if "?" in path else "?"
        reply = await self._session.get(
            f"{path}{separator}watch=1&allowWatchBookmarks=true&resourceVersion={version}&timeoutSeconds=3600"
        )
        if reply.status != 200:
            raise RuntimeError(f"watch {path}: {reply.status} {await reply.text()}")
        return reply

    async def _follow(
        self, path: str, reply: aiohttp.ClientResponse, version: str,
        on_event: Callable[[str, dict[str, Any], float], None],
    ) -> None:
        """Read the watch's events as they come; when the server ends it, watch again from the last
        resourceVersion seen, as client-go's reflector does. kube-apiserver ends a watch whose reader
        falls behind ("Forcing ... watcher close due to unresponsiveness" in its log), which a busy
        2-core machine brings about; events after such a gap arrive late, as they would to any client.
        A version too old to resume from (410 Gone) means listing again."""
        while True:
            gone = False
            async with reply:
                with contextlib.suppress(aiohttp.ClientPayloadError):  # a watch cut off mid-stream
                    async for line in reply.content:
                        now = time.monotonic()
                        event = json.loads(line)
                        if event["type"] == "ERROR":
                            if event["object"].get("code") == 410:
                                gone = True
                                break
                            raise RuntimeError(f"watch {path}: {event['object']}")
                        version = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            on_event(event["type"], event["object"], now)
            self.watch_restarts += 1
            if gone:
                version = await self._list(path, on_event)
            reply = await self._open_watch(path, version)

    def _on_job(self, event_type: str, job: dict[str, Any], now: float) -> None:
        self.job_events += 1
        meta = job["metadata"]
        if event_type == "ADDED":
            self.added_at.setdefault((contract.PLURAL, meta["namespace"], meta["name"]), now)
        phase = (job.get("status") or {}).get("phase")
        if phase:
            self.phase_at.setdefault((meta["namespace"], meta["name"], phase), now)

    def _on_pod(self, event_type: str, pod: dict[str, Any], now: float) -> None:
        self.job_events += 1
        meta = pod["metadata"]
        if event_type == "ADDED":
            self.added_at.setdefault(("pods", meta["namespace"], meta["name"]), now)
        self._pods[meta["namespace"], meta["name"]] = pod

    def check(self) -> None:
        """Raise what ended a watch of the benchmark's, if one ended for good."""
        for watch in self._watches:
            if watch.done():
                watch.result()

    # --- The benchmark's side ------------------------------------------------------------------

    async def start_operator(self, args: tuple[str, ...]) -> OperatorProcess:
        """`dtrain operator` with the admin's kubeconfig; returns once it watches pods."""
        operator = OperatorProcess(Path(self.plane.kubeconfig), self.workdir / "operator.log", args)
        operator.start()
        await _until(lambda: "watch pods" in self.operator_requests(), "the operator's watch of pods", operator)
        return operator

    async def create(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        await self._request("POST", f"/apis/{contract.API_VERSION}/namespaces/{meta['namespace']}/{contract.PLURAL}",
                            obj)

    async def run_pod(self, namespace: str, name: str) -> None:
        """The kubelet's report that the pod's containers run (the server needs no node for it)."""
        pod = self._pods[namespace, name]
        now = now_rfc3339()
        status = {
            "phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.1", "startTime": now,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": container_status(pod, {"running": {"startedAt": now}}, ready=True),
        }
        await self._request("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": status},
                            "application/merge-patch+json")

    def operator_requests(self) -> list[str]:
        self.check()
        # Its Lease renewals are not a job's.
        return [kind for kind in self._audit.requests_of(OPERATOR_AGENTS) if kind.split()[1] != "leases"]

    def _cpu(self) -> dict[str, float]:
        seconds = {}
        for component in COMPONENTS:
            pid = self.plane.pid(component)
            if pid is not None:
                times = psutil.Process(pid).cpu_times()
                seconds[component] = times.user + times.system
        times = psutil.Process().cpu_times()
        seconds["benchmark"] = times.user + times.system
        return seconds

    def start_cpu_clock(self) -> None:
        self._cpu_at_start = self._cpu()

    def server_cpu_seconds(self) -> dict[str, float]:
        """CPU seconds since start_cpu_clock: kube-apiserver, etcd, the benchmark (its watches, the kubelet)."""
        return {name: value - self._cpu_at_start.get(name, 0.0) for name, value in self._cpu().items()}


async def _until(check: Callable[[], bool], what: str, operator: OperatorProcess,
                 timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if not operator.running:
            raise SystemExit(f"the operator exited while waiting for {what}:\n{operator.log_tail()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}\n{operator.log_tail(30)}")
        await asyncio.sleep(0.1)
