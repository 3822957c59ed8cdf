"""`pods/log` for the test API server: the one extension the client's `logs` needs, kept out of apiserver.py.

`LogServingApiServer` is `ApiServer` plus `GET /api/v1/namespaces/NS/pods/POD/log`, answered from
`PodLogs`, a store of each container's captured output. Whoever plays the kubelet writes there: a
test directly (`api.pod_logs.write(ns, pod, "line\\n")`), or a local kubelet that runs containers and
captures their output. What it serves, as the kubelet does:

- the container's output as text/plain; `container` picks one (default: the pod's only or first
  container, as the API server does); `tailLines=N` the last N lines;
- `follow=true` keeps the response open and streams what is written, until the container ends
  (`PodLogs.end`), the pod is deleted, or the client goes away;
- 404 for a pod that does not exist, 400 for a container the pod does not have, and 400 with the
  API server's own message ("... is waiting to start") while nothing was written for a container
  that has not ended;
- the request is recorded and passes the fault injection (`api.faults`) as every other request.

Use `running_cluster_with_logs(tmp)` in place of `cluster.running_cluster(tmp)`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp.web
import attrs
import kmock

from .apiserver import ApiServer
from .calls import Call
from .cluster import PODS, Cluster
from .kmock_adapter import KubernetesError, Request, raw_request

LogKey = tuple[str, str, str]  # namespace, pod, container


class PodLogs:
    """Captured output by (namespace, pod, container); followers are woken by every write."""

    def __init__(self) -> None:
        self._text: dict[LogKey, str] = {}
        self._ended: set[LogKey] = set()
        self._changed = asyncio.Condition()

    def write(self, namespace: str, pod: str, text: str, container: str = "trainer") -> None:
        key = (namespace, pod, container)
        self._text[key] = self._text.get(key, "") + text
        self._notify()

    def end(self, namespace: str, pod: str, container: str = "trainer") -> None:
        """The container exited: followers get the rest and their response ends."""
        self._ended.add((namespace, pod, container))
        self._notify()

    def text(self, key: LogKey) -> str:
        return self._text.get(key, "")

    def has(self, key: LogKey) -> bool:
        return key in self._text

    def ended(self, key: LogKey) -> bool:
        return key in self._ended

    def _notify(self) -> None:
        async def wake() -> None:
            async with self._changed:
                self._changed.notify_all()

        with contextlib.suppress(RuntimeError):  # no running loop: nobody can be waiting
            asyncio.get_running_loop().create_task(wake())

    async def wait_for_change(self, timeout: float) -> None:
        async with self._changed:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)


def _tail(text: str, lines: str | None) -> str:
    if lines is None or not lines.isdigit():
        return text
    count = int(lines)
    if count == 0:
        return ""
    kept = text.splitlines(keepends=True)[-count:]
    return "".join(kept)


@attrs.define(kw_only=True)
class LogServingApiServer(ApiServer):
    """The test API server, serving `pods/log` from `pod_logs`."""

    pod_logs: PodLogs = attrs.field(factory=PodLogs, init=False)

    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        resource = request.resource
        if resource is None or resource.plural != "pods" or request.subresource != "log" or not request.name:
            return await super()._handle(request)
        self.calls.append((request.headers.get("User-Agent", ""), Call("get", "", "pods", "log")))
        await self.faults.intercept(request)
        return await self._serve_log(request)

    def _pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        key = (PODS, namespace, name)
        if key not in self.objects or self.objects[key].deleted:  # type: ignore[index]
            return None
        return dict(self.objects[key].last.raw)  # type: ignore[index]

    async def _serve_log(self, request: Request) -> aiohttp.web.StreamResponse:
        namespace, name = request.namespace or "default", request.name
        pod = self._pod(namespace, name)
        if pod is None:
            raise KubernetesError(404, "NotFound", f'pods "{name}" not found')
        containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        container = request.params.get("container") or (containers[0] if containers else "")
        if container not in containers:
            raise KubernetesError(
                400, "BadRequest", f"container {container} is not valid for pod {name}"
            )
        key = (namespace, name, container)
        if not self.pod_logs.has(key) and not self.pod_logs.ended(key):
            raise KubernetesError(
                400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            )
        full = self.pod_logs.text(key)
        text = _tail(full, request.params.get("tailLines"))
        follow = request.params.get("follow") in ("true", "1")
        if not follow:
            return aiohttp.web.Response(text=text, content_type="text/plain")
        raw = raw_request(request)
        assert raw is not None
        response = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        await response.prepare(raw)
        await response.write(text.encode())
        sent = len(full)
        while True:
            transport = raw.transport
            if transport is None or transport.is_closing():
                return response
            current = self.pod_logs.text(key)
            if len(current) > sent:
                await response.write(current[sent:].encode())
                sent = len(current)
            if self.pod_logs.ended(key) or self._pod(namespace, name) is None:
                await response.write_eof()
                return response
            await self.pod_logs.wait_for_change(0.2)


@contextlib.asynccontextmanager
async def running_cluster_with_logs(tmp: Any) -> AsyncIterator[Cluster]:
    """`cluster.running_cluster`, with an API server that serves pods/log (`cluster.api.pod_logs`)."""
    async with LogServingApiServer() as api, kmock.Server(api):
        api.declare_resources()
        cluster = Cluster(api, tmp)
        api.admission.append(cluster.refusals.hook)
        try:
            yield cluster
        finally:
            for process in cluster.operators:
                if process.running:
                    process.stop()
            api.faults.clear()
