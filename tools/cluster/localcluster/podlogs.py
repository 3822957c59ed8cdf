"""`kubectl logs` of this node's pods: the kubelet's `/containerLogs/...` over HTTPS, for the API server's
kubelet-client certificate only."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aiohttp
import aiohttp.web

from . import layout, pki
from .podrun import PodRun


class LogServer:
    """The node's log endpoint over its pods: those it runs (`runs`, by uid) and those its folder remembers."""

    def __init__(self, node: layout.Node, runs: dict[str, PodRun]) -> None:
        self.node = node
        self.runs = runs

    def _log_path(self, namespace: str, name: str) -> Path | None:
        for run in sorted(self.runs.values(), key=lambda r: r.started_at, reverse=True):
            if run.namespace == namespace and run.name == name:
                return run.folder / "container.log"
        matches = sorted((self.node.folder / "pods").glob(f"{namespace}_{name}_*/container.log"),
                         key=lambda p: p.stat().st_mtime)
        return matches[-1] if matches else None

    async def serve_logs(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        path = self._log_path(request.match_info["namespace"], request.match_info["pod"])
        if path is None or not path.exists():
            raise aiohttp.web.HTTPNotFound(text="no such pod on this node")
        text = path.read_text(errors="replace")
        if "tailLines" in request.query:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(request.query["tailLines"]):]) if int(request.query["tailLines"]) else ""
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(text.encode())
        if request.query.get("follow") in ("true", "1"):
            sent = path.stat().st_size
            while True:
                await asyncio.sleep(0.5)
                size = path.stat().st_size
                if size > sent:
                    with path.open("rb") as handle:
                        handle.seek(sent)
                        await response.write(handle.read(size - sent))
                    sent = size
                run = next((r for r in self.runs.values() if r.folder / "container.log" == path), None)
                if run is None or run.finished:
                    break
        return response

    async def start(self) -> aiohttp.web.AppRunner:
        app = aiohttp.web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self.serve_logs)
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        cert, key = pki.serving(f"{self.node.name}-serving", f"system:node:{self.node.name}", [])
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca()[0]))
        context.load_cert_chain(str(cert), str(key))
        context.verify_mode = ssl.CERT_REQUIRED  # only the API server's kubelet-client certificate
        await aiohttp.web.TCPSite(runner, layout.BRIDGE_ADDRESS, self.node.kubelet_port, ssl_context=context).start()
        return runner
