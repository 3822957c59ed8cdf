"""Rank 0's records into the status, coalesced per job: at most one status write of records per job every
WRITE_SECONDS, on a client of their own, so that no job's reporting, however often, delays another job's reconcile
or floods etcd. Records that arrive meanwhile are merged into the pending patch (api.records.merge_patches), as if
each had been written in turn; the maps a record replaces lose, at the write, the keys it no longer sends.

The reconciler decides from the status with the pending records on it (`pending`), so a record's news (a stage, the
end of training) is acted on at once; a status write of its own carries them along (`written`). A gang's first
training batch is what a user watching a start or a restart waits for: the reconcile that every record starts writes
it at once (`news`), with whatever it changes in the status (the phase of a restarted gang), in one patch. What comes
before it (the pre-flight, the sanity check) waits like any record, from the job's first record on, and so usually
goes with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dtrain_operator.api import contract
from dtrain_operator.api.record_patches import merge_patches
from dtrain_operator.controller.kube import ApiError
from dtrain_operator.core.observation import JobKey

logger = logging.getLogger(__name__)

# Within contract.DEFAULT_PROGRESS_INTERVAL_SECONDS: a record that comes after a quiet interval is written at once, so
# the writes that show a gang's progress are never further apart than its records are.
WRITE_SECONDS = 10.0

Write = Callable[[JobKey, Mapping[str, Any]], Awaitable[None]]


class CoalescedWrites:
    """The pending status patch of each job, written at most every `interval` seconds."""

    def __init__(self, write: Write, interval: float = WRITE_SECONDS) -> None:
        self._write = write
        self._interval = interval
        self._pending: dict[JobKey, dict[str, Any]] = {}
        self._written_at: dict[JobKey, float] = {}
        self._flushing: dict[JobKey, asyncio.Task[None]] = {}
        self._gang_written: dict[JobKey, tuple[Any, bool]] = {}  # the gang generation written, and if it trained

    def add(self, key: JobKey, patch: Mapping[str, Any]) -> None:
        self._pending[key] = merge_patches(self._pending.get(key) or {}, patch)
        self._written_at.setdefault(key, time.monotonic())  # a job's first record waits the interval too
        if key not in self._flushing:
            self._flushing[key] = asyncio.create_task(self._flush(key), name=f"report-write-{key[0]}/{key[1]}")

    def pending(self, key: JobKey) -> dict[str, Any]:
        """The records of the job not written yet, as one patch ({} when none)."""
        return dict(self._pending.get(key) or {})

    def written(self, key: JobKey, patch: Mapping[str, Any]) -> None:
        """Another write carried `patch` (what `pending` gave): nothing to write, unless records came since, and those
        wait the interval from this write."""
        self._note_gang(key, patch)
        self._written_at[key] = time.monotonic()
        if self._pending.get(key) == patch:
            del self._pending[key]

    def _note_gang(self, key: JobKey, patch: Mapping[str, Any]) -> None:
        gang = _gang(patch)
        if gang is None:
            return
        before = self._gang_written.get(key)
        # A gang that was written training stays so: a later write caught in its checkpointing is no first batch.
        trained = gang[1] or (before is not None and before[0] == gang[0] and before[1])
        self._gang_written[key] = (gang[0], trained)

    def news(self, key: JobKey) -> bool:
        """The pending records hold a gang's first training batch: the reconciler writes them at once."""
        gang = _gang(self._pending.get(key) or {})
        written = self._gang_written.get(key)
        return gang is not None and gang[1] and (written is None or gang[0] != written[0] or not written[1])

    def forget(self, key: JobKey) -> None:
        """The job is gone: nothing of it is written any more."""
        self._pending.pop(key, None)
        self._written_at.pop(key, None)
        self._gang_written.pop(key, None)
        task = self._flushing.pop(key, None)
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        tasks = list(self._flushing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _flush(self, key: JobKey) -> None:
        try:
            while key in self._pending:
                wait = self._written_at[key] + self._interval - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue  # a status write of the reconciler's may have carried them meanwhile (`written`)
                patch = self._pending.pop(key)
                self._written_at[key] = time.monotonic()
                self._note_gang(key, patch)
                try:
                    await self._write(key, patch)
                except ApiError as exc:
                    logger.warning("%s/%s: rank 0's records were not written (%s %s)", *key, exc.status, exc.reason)
        finally:
            if self._flushing.get(key) is asyncio.current_task():  # not a task for a new job of the same name
                del self._flushing[key]


def _gang(patch: Mapping[str, Any]) -> tuple[Any, bool] | None:
    """The gang generation a patch's progress is of, and whether it trains (a batch done, in the training stage: the
    sanity check's validation batch before the first step is not training); None without progress."""
    progress = patch.get("progress")
    if not isinstance(progress, Mapping) or "gangGeneration" not in progress:
        return None
    trains = bool(progress.get("batches")) and progress.get("stage") == contract.PROGRESS_STAGE_TRAINING
    return progress["gangGeneration"], trains
