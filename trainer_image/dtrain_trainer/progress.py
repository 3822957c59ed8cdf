"""Live progress from rank 0, through a pluggable sink that can never fail or slow training.

The sink is chosen by DTRAIN_PROGRESS_SINK:

- `operator` (in a pod): sends the records that change the job's status (progress, the
  pre-flight check, checkpoints) over HTTPS to the operator at DTRAIN_OPERATOR_URL, which
  checks the pod's token and writes them into the status of the DistributedTraining named by
  DTRAIN_JOB_NAME in DTRAIN_JOB_NAMESPACE; from a background thread, keeping only the newest
  of each (progress_sinks.OperatorSink); and prints the `stdout` lines too, so that
  `kubectl logs` shows progress.
- `stdout`: one human line per record (the default when the variable is unset).
- `jsonl:<path>`: one JSON object per line, appended to <path> and flushed per line.
  `dtrain run` reads this file to draw its progress bar.
- `none`: nothing.

Progress records are rate-limited to one per DTRAIN_PROGRESS_INTERVAL_SECONDS (default
15) plus one at each epoch end and at the end of training; events are always sent.
A sink that raises is reported once as a warning and then ignored.

Each record is built from its typed model in dtrain_operator.api.records, which documents
the record format and how readers read it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, Protocol

from dtrain_operator.api.records import Event, build_record
from dtrain_trainer.operator_link import describe_failure

log = logging.getLogger("dtrain_trainer")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


class Sink(Protocol):
    def send(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class ProgressReporter:
    """Sends records to a sink: events at once, progress at most once per interval unless forced.

    A sink that raises is warned about once and then ignored, so that reporting can never
    stop training.
    """

    def __init__(self, sink: Sink, interval_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.sink = sink
        self.interval = interval_seconds
        self.clock = clock
        self._last_progress: float | None = None
        self._broken = False
        # The training thread and the hang watch's (dtrain_trainer.hang_watch) both send: one record at a time.
        self._lock = threading.Lock()

    def _send(self, record: dict[str, Any]) -> None:
        if self._broken:
            return
        try:
            with self._lock:
                self.sink.send(record)
        except Exception as exc:  # noqa: BLE001 - a full disk or a closed pipe must not stop training
            self._broken = True
            log.warning(
                "progress sink %s failed (%s); progress is no longer reported",
                type(self.sink).__name__,
                describe_failure(exc),
            )

    def event(self, event: Event, **fields: Any) -> None:
        """Send the record of `event`; a field it does not have, or a value of the wrong type, raises."""
        self._send(build_record(event, time=utc_now(), **fields).to_wire())

    def progress_due(self) -> bool:
        return self._last_progress is None or self.clock() - self._last_progress >= self.interval

    def progress(self, **fields: Any) -> None:
        self._last_progress = self.clock()
        self.event(Event.PROGRESS, **fields)

    def close(self) -> None:
        try:
            self.sink.close()
        except Exception as exc:  # noqa: BLE001 - a sink that cannot close must not fail the run's end
            if not self._broken:
                log.warning(
                    "progress sink %s failed while closing (%s)", type(self.sink).__name__, describe_failure(exc)
                )

