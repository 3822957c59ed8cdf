"""A small client of the API server for the kubelets: HTTPS with the node's client certificate,
JSON requests, and list-then-watch streams that resume from the last resourceVersion."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from . import layout, pki

log = logging.getLogger("localcluster.api")


class ApiError(Exception):
    """A request that did not succeed: the HTTP status, or 0 when the API server did not answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth sending again: no answer (the API server stopped, a timeout), 429 or a 5xx."""
        return self.status == 0 or self.status == 429 or self.status >= 500


def client_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca()[0]))
    context.load_cert_chain(str(cert), str(key))
    return context


class Api:
    def __init__(self, cert: Path, key: Path, server: str = layout.APISERVER_URL) -> None:
        self.server = server
        self._ssl = client_context(cert, key)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:  # noqa: PYI034 (never subclassed)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl, limit=20))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json", **params: str
    ) -> dict[str, Any]:
        assert self._session is not None
        data = None if body is None else json.dumps(body)
        try:
            async with self._session.request(
                method, self.server + path, data=data, params=params or None,
                headers={"Content-Type": content_type, "Accept": "application/json"},
                timeout=aiohttp.ClientTimeout(total=30),
            ) as reply:
                text = await reply.text()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise ApiError(0, str(exc) or type(exc).__name__) from exc
        if reply.status >= 300:
            try:
                message = json.loads(text).get("message", text)
            except ValueError:
                message = text
            raise ApiError(reply.status, message[:500])
        return json.loads(text) if text else {}

    async def persist(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                      gone: tuple[int, ...] = (404,)) -> None:
        """Send until the API server takes it, through outages (as a kubelet's status manager does); an
        answer in `gone` means there is nothing left to do it to. Other refusals are logged and dropped."""
        delay = 0.5
        while True:
            try:
                await self.request(method, path, body, content_type)
                return
            except ApiError as exc:
                if exc.status in gone:
                    return
                if not exc.transient:
                    log.warning("%s %s refused: %s", method, path, exc)
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)

    async def patch(self, path: str, body: Any, kind: str = "merge") -> dict[str, Any]:
        content_type = {"merge": "application/merge-patch+json", "strategic": "application/strategic-merge-patch+json"}
        return await self.request("PATCH", path, body, content_type[kind])

    async def watch(self, path: str, **params: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Every object of a list, as ("ADDED", obj) events, then the watch's events, forever: a
        watch that ends resumes from the last resourceVersion; one that expired (410) lists again."""
        assert self._session is not None
        version = ""
        while True:
            try:
                if not version:
                    listed = await self.request("GET", path, **params)
                    version = listed["metadata"]["resourceVersion"]
                    yield "SYNC", listed
                async with self._session.get(
                    self.server + path,
                    params={**params, "watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true",
                            "timeoutSeconds": "300"},
                    timeout=aiohttp.ClientTimeout(total=None, sock_read=330),
                ) as reply:
                    if reply.status >= 300:
                        raise ApiError(reply.status, (await reply.text())[:300])
                    async for line in reply.content:
                        event = json.loads(line)
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            if obj.get("code") == 410:
                                version = ""
                            break
                        version = obj["metadata"].get("resourceVersion", version)
                        if event["type"] != "BOOKMARK":
                            yield event["type"], obj
            except (aiohttp.ClientError, asyncio.TimeoutError, ApiError, ValueError) as exc:
                log.info("watch %s: %s; again in 1 s", path, exc)
                if isinstance(exc, ApiError) and exc.status == 410:
                    version = ""
                await asyncio.sleep(1)
