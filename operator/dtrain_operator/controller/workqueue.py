"""The reconciler's work queue: each key processed by one worker at a time, re-run when it changed meanwhile,
retried with exponential backoff after a failure (as client-go's workqueue).

Why not kopf's handlers alone: kopf runs a handler for the events of the object it watches, each
object on its own, so a job would be reconciled for its own events and again from the handlers of
each of its pods, each time reading and writing as if alone. Here every event only marks its job;
one worker reconciles the job once for all the events that arrived meanwhile.
bench/operator_scale.py measures it on the real API server: 200 jobs of 4 nodes, 13 watch events
of a job and its pods per job, 5.4 reconciles per job (2026-12-02, docs/performance.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from dtrain_operator.controller.kube import (
    ApiError,
)

WORKERS = 32
"""Jobs reconciled at once."""
RETRY_BASE_SECONDS = 0.005
RETRY_MAX_SECONDS = 30.0
"""A failed reconcile is retried after 5 ms, 10 ms, 20 ms, ... up to 30 s (client-go's workqueue
starts at 5 ms too), and never before the Retry-After the API server asked for."""


K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """Keys to process, each at most once at a time; a key added while in process runs again after."""

    def __init__(
        self,
        process: Callable[[K], Awaitable[float | None]],
        on_error: Callable[[K, Exception], None],
        workers: int = WORKERS,
    ) -> None:
        self._process = process
        self._on_error = on_error
        self._workers = workers
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[K, int] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def __len__(self) -> int:
        return len(self._queued) + len(self._active)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._work(), name=f"reconciler-{i}") for i in range(self._workers)]

    async def stop(self) -> None:
        for _, handle in self._timers.values():
            handle.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def add(self, key: K, delay: float = 0.0) -> None:
        if delay > 0:
            due = time.monotonic() + delay
            scheduled = self._timers.get(key)
            if scheduled is not None and scheduled[0] <= due:
                return
            if scheduled is not None:
                scheduled[1].cancel()
            handle = asyncio.get_running_loop().call_later(delay, self._fire, key)
            self._timers[key] = (due, handle)
            return
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def forget(self, key: K) -> None:
        scheduled = self._timers.pop(key, None)
        if scheduled is not None:
            scheduled[1].cancel()
        self._failures.pop(key, None)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            requeue: float | None
            try:
                requeue = await self._process(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - one job's failure must not stop the others
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                requeue = retry_delay(failures, exc)
                self._on_error(key, exc)
            finally:
                self._active.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
            if requeue is not None:
                self.add(key, requeue)


def retry_delay(failures: int, exc: Exception) -> float:
    """When a reconcile that failed `failures` times in a row runs again."""
    backoff = min(RETRY_BASE_SECONDS * 2 ** min(failures - 1, 32), RETRY_MAX_SECONDS)
    retry_after = exc.retry_after if isinstance(exc, ApiError) else None
    return max(backoff, min(retry_after, RETRY_MAX_SECONDS)) if retry_after is not None else backoff
