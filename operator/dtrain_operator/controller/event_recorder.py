"""Posting the Events a status change asks for: in the background (children are not kept waiting), in order
for each job, and a Warning that repeats within EVENT_SERIES_SECONDS counts up the Event posted first
(Kubernetes' event aggregation), as client-go's EventRecorder does.

Why not kopf's own (`kopf.event`): it posts a new Event for every call (its post_event says
aggregation "should be done by the client library, as it is done in the Go client", and does not
do it). A Warning that holds, such as PodsPending or ImagePullBackOff, is said at every reconcile
that finds it; here it is one Event with a count, so the Events per job stay at what a phase
change asks for (2 per job in bench/operator_scale.py's run of 200 jobs on the real API server).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from dtrain_operator.controller.kube import ApiError, KubeClient
from dtrain_operator.core.observation import JobKey
from dtrain_operator.core.status.events import JobEvent

logger = logging.getLogger(__name__)


EVENT_SERIES_SECONDS = 600.0
"""A Warning that repeats within this long (Kubernetes' event aggregation window) counts up one Event."""


class EventRecorder:
    """One operator's Events, posted as `instance` (its pod)."""

    def __init__(self, client: KubeClient, instance: str) -> None:
        self._client = client
        self._instance = instance
        self._tasks: dict[JobKey, asyncio.Task[None]] = {}
        # Event series: (job, uid, reason) -> (Event name, count, last seen, monotonic).
        self._series: dict[tuple[JobKey, str, str], tuple[str, int, float]] = {}

    def forget(self, key: JobKey) -> None:
        for series_key in [k for k in self._series if k[0] == key]:
            del self._series[series_key]

    def stop(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()

    async def warn(self, key: JobKey, body: Mapping[str, Any], reason: str, message: str) -> None:
        """One Warning Event now; a failure to post it is logged, never raised."""
        try:
            await self._client.post_event(body, "Warning", reason, message, self._instance)
        except ApiError as exc:
            logger.warning("%s/%s: could not post the %s event: %s", *key, reason, exc)

    def post(self, key: JobKey, body: Mapping[str, Any], events: list[JobEvent]) -> None:
        """Post Events in the background, in order for each job."""
        earlier = self._tasks.get(key)
        task = asyncio.create_task(self._post_in_order(key, body, events, earlier))
        self._tasks[key] = task
        task.add_done_callback(lambda done: self._tasks.pop(key) if self._tasks.get(key) is done else None)

    async def _post_in_order(
        self, key: JobKey, body: Mapping[str, Any], events: list[JobEvent], earlier: asyncio.Task[None] | None
    ) -> None:
        if earlier is not None:
            await asyncio.wait([earlier])
        uid = (body.get("metadata") or {}).get("uid", "")
        for event in events:
            try:
                await self._post_event(key, uid, body, event)
            except ApiError as exc:
                logger.warning("%s/%s: could not post the %s event: %s", *key, event.reason, exc)

    async def _post_event(self, key: JobKey, uid: str, body: Mapping[str, Any], event: JobEvent) -> None:
        """Post an Event; a repeat of a series within EVENT_SERIES_SECONDS counts up the Event posted first."""
        now = time.monotonic()
        series_key = (key, uid, event.reason)
        earlier = self._series.get(series_key) if event.series else None
        if earlier is not None and now - earlier[2] <= EVENT_SERIES_SECONDS:
            name, count, _ = earlier
            try:
                await self._client.repeat_event(key[0], name, count + 1, event.message)
                self._series[series_key] = (name, count + 1, now)
                return
            except ApiError as exc:
                if not exc.not_found:
                    raise
        created = await self._client.post_event(body, event.type, event.reason, event.message, self._instance)
        if event.series:
            self._series[series_key] = (str((created.get("metadata") or {}).get("name", "")), 1, now)
