"""The watch machinery of the operator tests' API server (apiserver.py): the event log of every write,
label selectors, and watch streams that replay from a resourceVersion (410 Gone when it is older than
the log), as the API server's watch cache does."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any

from .kmock_adapter import Payload, Request, raw_request

_REQUIREMENT = re.compile(r"^(?P<key>[^\s!=]+)\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)$")


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector (equality- and set-based) against an object's labels."""
    for requirement in re.split(r",(?![^(]*\))", selector or ""):
        requirement = requirement.strip()
        if not requirement:
            continue
        match = _REQUIREMENT.match(requirement)
        if match:
            values = {v.strip() for v in match["values"].split(",")}
            present = labels.get(match["key"])
            if (match["op"] == "in") != (present in values):
                return False
        elif "!=" in requirement:
            key, value = requirement.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in requirement:
            key, value = requirement.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif requirement.startswith("!"):
            if requirement[1:] in labels:
                return False
        elif requirement not in labels:
            return False
    return True



@dataclasses.dataclass(frozen=True)
class _Event:
    rv: int
    type: str
    resource: Any
    namespace: str | None
    raw: dict[str, Any]



class Watches:
    """ApiServer's event log and watch streams: its `_events`, `_wakeup`, `_rv`, `_lock`, `faults` and
    `_matching` are ApiServer's."""

    def _emit(self, event_type: str, resource: Any, raw: dict[str, Any]) -> None:
        namespace = (raw.get("metadata") or {}).get("namespace")
        self._events.append(_Event(int(raw["metadata"]["resourceVersion"]), event_type, resource, namespace, raw))
        if self._wakeup is not None:
            self._wakeup.set()
        self._wakeup = asyncio.Event()

    def _events_after(self, cursor: int) -> list[_Event]:
        newer = []
        for event in reversed(self._events):
            if event.rv <= cursor:
                break
            newer.append(event)
        newer.reverse()
        return newer

    async def _serve_watch(self, request: Request) -> AsyncIterator[Payload]:
        yield b""  # send the headers: the stream is open
        loop = asyncio.get_running_loop()
        params = request.params
        selector = params.get("labelSelector", "")
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        deadline = loop.time() + timeout if timeout else None
        drops = self.faults.drops
        since = params.get("resourceVersion")
        if since in (None, "", "0"):
            async with self._lock:
                cursor = self._rv
                current = self._matching(request)
            for raw in current:
                yield {"type": "ADDED", "object": raw}
        else:
            cursor = int(since)
            if self._events and cursor < self._events[0].rv - 1:
                yield {
                    "type": "ERROR",
                    "object": {"kind": "Status", "apiVersion": "v1", "code": 410, "reason": "Expired",
                               "message": f"too old resource version: {cursor}"},
                }
                return
        raw = raw_request(request)
        transport = raw.transport if raw is not None else None
        dead = False
        while True:
            if transport is None or transport.is_closing():
                return  # the client went away (or was killed)
            wakeup = self._wakeup = self._wakeup or asyncio.Event()
            # A stream caught by a stall is dead for good: it delivers nothing and never ends by
            # itself, as a connection that broke without closing. Only the client can give it up.
            dead = dead or self.faults.stalled
            if dead:
                await asyncio.sleep(0.2)
                continue
            for event in self._events_after(cursor):
                cursor = event.rv
                if event.resource != request.resource:
                    continue
                if request.namespace is not None and event.namespace != request.namespace:
                    continue
                if not selector_matches(selector, (event.raw.get("metadata") or {}).get("labels") or {}):
                    continue
                yield {"type": event.type, "object": event.raw}
            if self.faults.drops != drops:
                return
            if deadline is not None and loop.time() >= deadline:
                return
            wait = 0.2 if deadline is None else min(0.2, max(deadline - loop.time(), 0.0))
            try:
                await asyncio.wait_for(wakeup.wait(), timeout=wait)
            except asyncio.TimeoutError:
                pass
