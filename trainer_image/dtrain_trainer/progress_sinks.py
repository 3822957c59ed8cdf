"""Where rank 0's progress records go (DTRAIN_PROGRESS_SINK, see dtrain_trainer.progress): stdout, a JSONL
file, the operator (which writes them into the job's status), or nowhere."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dtrain_common.errors import ConfigError
from dtrain_operator.api import contract
from dtrain_operator.api.records import Event, status_patch
from dtrain_trainer.operator_link import OperatorLink
from dtrain_trainer.progress import Sink

log = logging.getLogger("dtrain_trainer")

REQUEST_TIMEOUT_SECONDS = 5.0
MAX_RETRY_SECONDS = 30.0
# At the end (a pod going away after its SIGTERM checkpoint), how long the last records are tried
# for, a second apart: long enough to outlast a busy operator or a failover's first seconds, far
# inside a pod's grace period.
CLOSE_SECONDS = 15.0
CLOSING_RETRY_SECONDS = 1.0
MAX_ANSWER_BYTES = 2048
# The operator refused the records themselves (not this pod's, unreadable, too large): sending them again cannot help.
REFUSED_FOR_GOOD = frozenset({400, 403, 404, 413})


class NullSink:
    def send(self, record: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def _number(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def metrics_text(metrics: Any) -> str:
    """Reported metrics for a log line: `  val_loss 0.412  val_acc 0.87`."""
    if not isinstance(metrics, Mapping):
        return ""
    return "".join(f"  {name} {_number(value)}" for name, value in metrics.items())


def human_line(record: Mapping[str, Any]) -> str:
    """One record as a line for a person reading the log."""
    event = record.get("event")
    if event == Event.PROGRESS:
        total = record.get("totalSteps")
        step = f"{record.get('step')}/{total}" if total else str(record.get("step"))
        rate = record.get("imagesPerSecond")
        rate_text = f"  {rate:.1f} img/s" if rate is not None else ""
        return (
            f"epoch {record.get('epoch')}  step {step}  loss {_number(record.get('loss'))}{rate_text}"
            + metrics_text(record.get("metrics"))
        )
    if event == Event.START:
        return (
            f"training {record.get('jobName')}: {record.get('nodes')} node(s) x {record.get('devicesPerNode')} "
            f"{record.get('accelerator')} process(es), precision {record.get('precision')}"
            + (f", {record['lightning']}" if record.get("lightning") else "")
        )
    if event == Event.CHECKPOINT:
        if record.get("ok") is False:
            return f"checkpoint of step {record.get('step')} NOT saved to {record.get('path')}: {record.get('error')}"
        return f"checkpoint at step {record.get('step')}: {record.get('path')}{_by_survivor(record)}"
    if event == Event.RESUMED:
        return f"resumed from {record.get('path')} at step {record.get('step')}{_by_survivor(record)}"
    if event == Event.EXPORT:
        if record.get("ok"):
            error = _number(record.get("parityError"), 3)
            return f"exported {record.get('onnx')} (ONNX Runtime parity: max relative error {error})"
        return f"export failed: {record.get('error')}"
    if event == Event.FINISHED:
        loss = _number(record.get("loss"))
        return f"finished at step {record.get('step')} (epoch {record.get('epoch')}, loss {loss}){metrics_text(record.get('metrics'))}"
    if event == Event.STOPPED:
        return f"stopped by {record.get('signal')} at step {record.get('step')}; checkpoint {record.get('checkpoint')}"
    if event == Event.PREFLIGHT:
        return (
            f"pre-flight: {record.get('worldSize')} ranks joined, {record.get('backend')} all-reduce of "
            f"{record.get('allReduceBytes')} bytes {_number(record.get('allReduceMs'))} ms (bus "
            f"{_number(record.get('busBandwidthGBps'))} GB/s), latency {_number(record.get('latencyMs'))} ms; "
            f"{_number(record.get('seconds'))} s in all"
        )
    if event == Event.HANG:
        silent = f"; rank(s) {record['silent']} gave none" if record.get("silent") else ""
        return (
            f"no batch completed for {_number(record.get('stalledSeconds'), 3)} s at step {record.get('step')}: every "
            f"rank's stacks in {record.get('dumps')}{silent}"
        )
    if event in (Event.WARNING, Event.ERROR):
        return f"{event}: {record.get('message')}"
    return json.dumps(dict(record))


class StdoutSink:
    def send(self, record: Mapping[str, Any]) -> None:
        print(f"dtrain: {human_line(record)}", file=sys.stdout, flush=True)

    def close(self) -> None:
        pass


class JsonlSink:
    def __init__(self, path: Path) -> None:
        self.path = path

    def send(self, record: Mapping[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as file:
            file.write(json.dumps(dict(record), allow_nan=False) + "\n")

    def close(self) -> None:
        pass


class TeeSink:
    """Every record to each of several sinks."""

    def __init__(self, *sinks: Sink) -> None:
        self.sinks = sinks

    def send(self, record: Mapping[str, Any]) -> None:
        for sink in self.sinks:
            sink.send(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


class OperatorSink:
    """Sends rank 0's records to the operator over HTTPS from a background thread; the operator alone
    writes them into the job's status.

    The training thread only puts a record in a slot under a lock (one slot each for progress, the
    pre-flight check, the last checkpoint, a missed one and a hang's stacks; a newer record replaces the
    older), so an operator that is slow, failing over or unreachable costs training nothing and memory
    stays at five records. They are sent in the order they last changed, so the status ends as it would
    have, record by record.

    Requests go through operator_link: the pod's token for the operator, the operator's CA, the
    leader among the replicas. A failure is warned about once; the sender retries with backoff (up to
    MAX_RETRY_SECONDS) for as long as the trainer runs, and at the end (`close`) keeps trying the
    last records for up to `close_seconds`: the checkpoint a SIGTERM saved is the one the status
    must name when the pod is gone.
    """

    def __init__(
        self,
        url: str,
        namespace: str,
        name: str,
        token_path: Path = Path(contract.OPERATOR_TOKEN_PATH),
        ca_path: Path = Path(contract.OPERATOR_CA_PATH),
        request_timeout: float = REQUEST_TIMEOUT_SECONDS,
        resolve: Callable[[str, int], list[str]] | None = None,
        close_seconds: float = CLOSE_SECONDS,
    ) -> None:
        self.link = OperatorLink(url, token_path, ca_path, resolve)
        self.path = contract.report_path(namespace, name)
        self.where = f"{namespace}/{name}"
        self.request_timeout = request_timeout
        self.close_seconds = close_seconds
        self._slots: dict[str, dict[str, Any]] = {}
        self._closed = False
        self._close_deadline = 0.0
        self._warned = False
        self._condition = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="dtrain-operator-report", daemon=True)
        self._thread.start()

    def send(self, record: Mapping[str, Any]) -> None:
        slot = _slot(record)
        if slot is None:
            return
        with self._condition:
            self._slots.pop(slot, None)  # re-inserted last: the order in which slots last changed
            self._slots[slot] = dict(record)
            self._condition.notify()

    def close(self) -> None:
        """Send what is pending, trying again a second apart for up to `close_seconds`."""
        with self._condition:
            self._closed = True
            self._close_deadline = time.monotonic() + self.close_seconds
            self._condition.notify()
        # The last try may start just before the deadline and wait a request timeout per address.
        self._thread.join(self.close_seconds + 2 * self.request_timeout + 1.0)

    def _run(self) -> None:
        backoff = 0.0
        while True:
            with self._condition:
                while not self._slots and not self._closed:
                    self._condition.wait()
                if not self._slots:
                    return
                if backoff:
                    self._condition.wait(min(backoff, CLOSING_RETRY_SECONDS) if self._closed else backoff)
                batch = dict(self._slots)
            problem = self._deliver(list(batch.values()))
            with self._condition:
                if problem is None:
                    # Taken: forget what was sent, unless a newer record took its slot meanwhile.
                    for slot, record in batch.items():
                        if self._slots.get(slot) is record:
                            del self._slots[slot]
                    backoff = 0.0
                    continue
                if self._closed and time.monotonic() >= self._close_deadline:
                    self._failed(problem)
                    return
            self._failed(problem)
            backoff = min(max(1.0, backoff * 2), MAX_RETRY_SECONDS)

    def _deliver(self, records: list[dict[str, Any]]) -> str | None:
        """POST the records to the leader; None when it took them (or refused them for good), else why not."""
        body = json.dumps({"records": records}, allow_nan=False).encode()
        answer = self.link.post(self.path, body, self.request_timeout, final=REFUSED_FOR_GOOD)
        if isinstance(answer, str):
            return answer
        if answer.status in REFUSED_FOR_GOOD:
            # Retrying cannot change the answer: say why once, and drop these records.
            self._failed(f"{answer.status} {answer.body[:MAX_ANSWER_BYTES]}")
        return None

    def _failed(self, reason: str) -> None:
        if self._warned:
            log.debug("progress report to the operator failed: %s", reason)
            return
        self._warned = True
        log.warning(
            "progress report to the operator for %s failed (%s); training goes on, the latest records are "
            "sent once it answers, later failures are logged at debug level",
            self.where,
            reason,
        )


def _slot(record: Mapping[str, Any]) -> str | None:
    """Which of the sender's slots a record takes; None for a record that changes no status field."""
    patch = status_patch(record)
    if patch is None:
        return None
    field = next(iter(patch))
    if field == "lastCheckpoint" and patch[field].get("missed") is not None:
        return "lastCheckpoint.missed"
    return field


def sink_from_env(env: Mapping[str, str], job_name: str) -> Sink:
    """The sink DTRAIN_PROGRESS_SINK asks for (stdout when unset)."""
    choice = env.get(contract.ENV_PROGRESS_SINK) or contract.PROGRESS_SINK_STDOUT
    if choice == contract.PROGRESS_SINK_NONE:
        return NullSink()
    if choice == contract.PROGRESS_SINK_STDOUT:
        return StdoutSink()
    if choice.startswith(contract.PROGRESS_SINK_JSONL_PREFIX):
        path = choice[len(contract.PROGRESS_SINK_JSONL_PREFIX) :]
        if not path:
            raise ConfigError(
                f"{contract.ENV_PROGRESS_SINK} is {choice!r}: give a file, e.g. jsonl:/tmp/progress.jsonl"
            )
        return JsonlSink(Path(path))
    if choice == contract.PROGRESS_SINK_OPERATOR:
        url = env.get(contract.ENV_OPERATOR_URL)
        namespace = env.get(contract.ENV_JOB_NAMESPACE)
        if not url or not namespace:
            log.warning(
                "%s is operator but %s or %s is not set: progress is not reported to the job's status",
                contract.ENV_PROGRESS_SINK,
                contract.ENV_OPERATOR_URL,
                contract.ENV_JOB_NAMESPACE,
            )
            return StdoutSink()
        report = OperatorSink(url, namespace, env.get(contract.ENV_JOB_NAME) or job_name)
        return TeeSink(report, StdoutSink())
    raise ConfigError(
        f"{contract.ENV_PROGRESS_SINK} is {choice!r}; use operator, stdout, jsonl:<path> or none"
    )


def _by_survivor(record: Mapping[str, Any]) -> str:
    survivor = record.get("survivor")
    if not isinstance(survivor, Mapping):
        return ""
    return f" (saved by surviving rank {survivor.get('rank')} after a peer was lost)"
