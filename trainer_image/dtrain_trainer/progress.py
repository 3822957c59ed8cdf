"""Live progress from rank 0, through a pluggable sink that can never fail or slow training.

The sink is chosen by DTRAIN_PROGRESS_SINK:

- `kubernetes`: merge-patches `status.progress` and `status.lastCheckpoint` of the
  DistributedTraining named by DTRAIN_JOB_NAME in DTRAIN_JOB_NAMESPACE, with the pod's
  service account (or a kubeconfig outside a pod), from a background thread; and prints
  the `stdout` lines too, so that `kubectl logs` shows progress.
- `stdout`: one human line per record (the default when the variable is unset).
- `jsonl:<path>`: one JSON object per line, appended to <path> and flushed per line.
  `dtrain run` reads this file to draw its progress bar.
- `none`: nothing.

Progress records are rate-limited to one per DTRAIN_PROGRESS_INTERVAL_SECONDS (default
15) plus one at each epoch end and at the end of training; events are always sent.
A sink that raises is reported once as a warning and then ignored.

JSONL record format (every record has `event` and `time`, an RFC 3339 UTC timestamp;
fields that are not known yet are null; consumers must ignore fields they do not know):

    {"event": "start", "time": ..., "jobName": "quickstart", "worldSize": 2, "nodes": 2,
     "devicesPerNode": 1, "accelerator": "cpu", "precision": "32-true",
     "clusterEnvironment": "TorchElasticEnvironment", "maxSteps": -1, "maxEpochs": 2,
     "resumeFrom": "/ckpt/last.ckpt" | null,
     "lightning": "lightning.pytorch" | "pytorch_lightning"}   (the package the job trains with)
    {"event": "warning", "time": ..., "message": "precision 16-mixed needs a CUDA GPU ..."}
    {"event": "resumed", "time": ..., "path": "/ckpt/last.ckpt", "step": 40, "epoch": 1}
    {"event": "progress", "time": ..., "epoch": 0, "step": 12, "totalSteps": 128 | null,
     "loss": 2.301, "imagesPerSecond": 812.5 | null, "epochEnd": false,
     "stage": "training" | "validating" | "checkpointing" | "exporting",
     "metrics": {"val_loss": 0.41, "val_acc": 0.87, ...}, "validation": "val_loss=0.41" | null,
     "batches": 512, "batchTime": ...,
     "stepTimes": {"step": 150, "medianSeconds": 0.09, "slowestRank": 1, "slowestSeconds": 0.31,
                   "slowestPod": "job-1", "slowestNode": "node-b", "ratio": 3.4, "slowChecks": 3,
                   "straggler": true} | null}   (metrics: val_loss, val_acc, prog_bar and spec.logging.metrics;
     stepTimes: see stragglers.py)   (the last progress record, before the export, says exporting)
    {"event": "checkpoint", "time": ..., "step": 20, "path": "/ckpt/step=00000020.ckpt"}
    {"event": "export", "time": ..., "ok": true, "onnx": "/art/model.onnx",
     "parityError": 2.1e-07, "tolerance": 0.001, "artifacts": "/art/artifacts.json", "error": null}
    {"event": "finished", "time": ..., "ok": true, "step": 128, "epoch": 1, "loss": 0.41,
     "imagesPerSecond": 815.0, "exportError": "torch.onnx.export failed ..." (only when the export failed)}
    {"event": "stopped", "time": ..., "signal": "SIGTERM", "checkpoint": "/ckpt/last.ckpt", "step": 57,
     "epoch": 0, "loss": 0.9, "imagesPerSecond": 810.2}   (SIGTERM: every rank stopped after this step)
    {"event": "error", "time": ..., "message": "model.classPath: cannot import 'mypkg' ..."}
    {"event": "preflight", "time": ..., "backend": "gloo", "worldSize": 2, "seconds": 0.12,
     "joinSeconds": 0.01, "allReduceBytes": 4194304, "allReduceMs": 9.4, "latencyMs": 0.09,
     "busBandwidthGBps": 0.45, "versions": {...}, "ranks": [...]}   (see preflight.py)

`batches` counts the training and validation batches rank 0 has completed in this process, and
`batchTime` is when the latest completed: only the training and validation loops advance them (the
operator's progress deadline watches them, see dtrain_operator.progress_deadline). A record with
stage `checkpointing` is sent when a checkpoint starts to be written (the deadline holds meanwhile),
one with stage `validating` during validation, at the same rate as training's.

`step` is Lightning's global step (optimizer steps; with gradient accumulation one step
is several batches). `totalSteps` is the number of optimizer steps the run will take
when that is known. `loss` is rank 0's training loss as the model computed it (what it
logs as train_loss), averaged over the batches of the latest optimizer step (all
accumulateGradBatches of them), not Lightning's loss divided by accumulateGradBatches. `imagesPerSecond` counts
the images of all ranks (the batch of each rank times the world size), excluding the
first WARMUP_BATCHES batches of each process and the time between epochs (validation).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import lightning as L
import torch

from dtrain_operator.api import contract
from dtrain_trainer import flavor
from dtrain_trainer.config import ConfigError

log = logging.getLogger("dtrain_trainer")

EVENT_START = "start"
EVENT_WARNING = "warning"
EVENT_RESUMED = "resumed"
EVENT_PROGRESS = "progress"
EVENT_CHECKPOINT = "checkpoint"
EVENT_EXPORT = "export"
EVENT_FINISHED = "finished"
EVENT_STOPPED = "stopped"
EVENT_ERROR = "error"
EVENT_PREFLIGHT = "preflight"

# Metrics reported whenever the model logs them (besides its prog_bar metrics and spec.logging.metrics).
REPORTED_METRICS = ("val_loss", "val_acc")
# Batches at the start of each process that throughput leaves out: CUDA context,
# cuDNN autotuning and allocator growth make them unrepresentative.
WARMUP_BATCHES = 5
KUBERNETES_REQUEST_TIMEOUT_SECONDS = 5.0
SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


class Sink(Protocol):
    def send(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class NullSink:
    def send(self, record: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def _number(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def validation_text(metrics: Mapping[str, float]) -> str | None:
    """The first validation metric as name=value (the VAL column of `kubectl get dtr`)."""
    name = next((n for n in metrics if n.startswith("val")), None)
    return None if name is None else f"{name}={metrics[name]:.4g}"


def metrics_text(metrics: Any) -> str:
    """Reported metrics for a log line: `  val_loss 0.412  val_acc 0.87`."""
    if not isinstance(metrics, Mapping):
        return ""
    return "".join(f"  {name} {_number(value)}" for name, value in metrics.items())


def human_line(record: Mapping[str, Any]) -> str:
    """One record as a line for a person reading the log."""
    event = record.get("event")
    if event == EVENT_PROGRESS:
        total = record.get("totalSteps")
        step = f"{record.get('step')}/{total}" if total else str(record.get("step"))
        rate = record.get("imagesPerSecond")
        rate_text = f"  {rate:.1f} img/s" if rate is not None else ""
        return (
            f"epoch {record.get('epoch')}  step {step}  loss {_number(record.get('loss'))}{rate_text}"
            + metrics_text(record.get("metrics"))
        )
    if event == EVENT_START:
        return (
            f"training {record.get('jobName')}: {record.get('nodes')} node(s) x {record.get('devicesPerNode')} "
            f"{record.get('accelerator')} process(es), precision {record.get('precision')}"
            + (f", {record['lightning']}" if record.get("lightning") else "")
        )
    if event == EVENT_CHECKPOINT:
        return f"checkpoint at step {record.get('step')}: {record.get('path')}"
    if event == EVENT_RESUMED:
        return f"resumed from {record.get('path')} at step {record.get('step')}"
    if event == EVENT_EXPORT:
        if record.get("ok"):
            error = _number(record.get("parityError"), 3)
            return f"exported {record.get('onnx')} (ONNX Runtime parity: max relative error {error})"
        return f"export failed: {record.get('error')}"
    if event == EVENT_FINISHED:
        loss = _number(record.get("loss"))
        return f"finished at step {record.get('step')} (epoch {record.get('epoch')}, loss {loss}){metrics_text(record.get('metrics'))}"
    if event == EVENT_STOPPED:
        return f"stopped by {record.get('signal')} at step {record.get('step')}; checkpoint {record.get('checkpoint')}"
    if event == EVENT_PREFLIGHT:
        return (
            f"pre-flight: {record.get('worldSize')} ranks joined, {record.get('backend')} all-reduce of "
            f"{record.get('allReduceBytes')} bytes {_number(record.get('allReduceMs'))} ms (bus "
            f"{_number(record.get('busBandwidthGBps'))} GB/s), latency {_number(record.get('latencyMs'))} ms; "
            f"{_number(record.get('seconds'))} s in all"
        )
    if event in (EVENT_WARNING, EVENT_ERROR):
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


def status_patch(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The part of DistributedTraining.status a record updates (merge-patch shape), if any."""
    if record.get("event") == EVENT_PROGRESS:
        fields = {
            "epoch": record.get("epoch"),
            "step": record.get("step"),
            # Lets `dtrain get` and `dtrain watch` show an ETA.
            "totalSteps": record.get("totalSteps"),
            "loss": record.get("loss"),
            "imagesPerSecond": record.get("imagesPerSecond"),
            "stage": record.get("stage"),
            "metrics": record.get("metrics") or None,
            "validation": record.get("validation"),
            "batches": record.get("batches"),
            "batchTime": record.get("batchTime"),
            "stepTimes": record.get("stepTimes"),
            "updatedAt": record.get("time"),
        }
        # null in a merge patch deletes a field: leave out what is not known yet instead.
        return {"progress": {k: v for k, v in fields.items() if v is not None}}
    if record.get("event") == EVENT_PREFLIGHT:
        return {"preflight": {k: v for k, v in record.items() if k != "event" and v is not None}}
    if record.get("event") == EVENT_CHECKPOINT:
        return {"lastCheckpoint": {"step": record.get("step"), "path": record.get("path"), "time": record.get("time")}}
    return None


def describe_failure(exc: BaseException) -> str:
    """A short, secret-free description of why a request failed."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return f"HTTP {status} {getattr(exc, 'reason', '') or ''}".strip()
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


class KubernetesStatusSink:
    """Merge-patches the job's status from a background thread; only the newest value of each field is sent.

    The training thread only updates a dict under a lock, so a slow or failing API server
    costs it nothing. A failure is warned about once; later ones are logged at debug level.
    """

    def __init__(
        self,
        api: Any,
        name: str,
        namespace: str,
        request_timeout: float = KUBERNETES_REQUEST_TIMEOUT_SECONDS,
    ) -> None:
        self.api = api
        self.name = name
        self.namespace = namespace
        self.request_timeout = request_timeout
        self._pending: dict[str, Any] = {}
        self._closed = False
        self._warned = False
        self._condition = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="dtrain-status-patch", daemon=True)
        self._thread.start()

    def send(self, record: Mapping[str, Any]) -> None:
        patch = status_patch(record)
        if patch is None:
            return
        with self._condition:
            self._pending.update(patch)
            self._condition.notify()

    def close(self) -> None:
        """Send what is pending, waiting at most about one request timeout."""
        with self._condition:
            self._closed = True
            self._condition.notify()
        self._thread.join(self.request_timeout + 1.0)

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._pending and not self._closed:
                    self._condition.wait()
                if not self._pending:
                    return
                body, self._pending = {"status": self._pending}, {}
            try:
                self.api.patch_namespaced_custom_object_status(
                    contract.GROUP,
                    contract.VERSION,
                    self.namespace,
                    contract.PLURAL,
                    self.name,
                    body,
                    _request_timeout=self.request_timeout,
                    _content_type="application/merge-patch+json",
                )
            except Exception as exc:  # noqa: BLE001 - the API server's trouble must never become the training's
                self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        reason = describe_failure(exc)
        if self._warned:
            log.debug("progress report to the Kubernetes API failed: %s", reason)
            return
        self._warned = True
        log.warning(
            "progress report to the Kubernetes API failed (%s) for %s/%s; training goes on, "
            "later failures are logged at debug level",
            reason,
            self.namespace,
            self.name,
        )


def _kubernetes_api(env: Mapping[str, str]) -> Any:
    """A CustomObjectsApi with the pod's service account, or else the kubeconfig ($KUBECONFIG or ~/.kube/config)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        return client.CustomObjectsApi(config.new_client_from_config(config_file=env.get("KUBECONFIG")))
    return client.CustomObjectsApi(client.ApiClient(configuration))


def _namespace(env: Mapping[str, str]) -> str | None:
    if env.get(contract.ENV_JOB_NAMESPACE):
        return env[contract.ENV_JOB_NAMESPACE]
    try:
        return SERVICE_ACCOUNT_NAMESPACE_FILE.read_text().strip() or None
    except OSError:
        return None


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
    if choice == contract.PROGRESS_SINK_KUBERNETES:
        namespace = _namespace(env)
        if namespace is None:
            log.warning(
                "%s is kubernetes but %s is not set and there is no service account namespace: "
                "progress is not reported to the job's status",
                contract.ENV_PROGRESS_SINK,
                contract.ENV_JOB_NAMESPACE,
            )
            return StdoutSink()
        try:
            api = _kubernetes_api(env)
        except Exception as exc:  # noqa: BLE001 - no service account and no kubeconfig: train anyway
            log.warning(
                "cannot reach the Kubernetes API (%s): progress is not reported to the job's status",
                describe_failure(exc),
            )
            return StdoutSink()
        status = KubernetesStatusSink(api, env.get(contract.ENV_JOB_NAME) or job_name, namespace)
        return TeeSink(status, StdoutSink())
    raise ConfigError(
        f"{contract.ENV_PROGRESS_SINK} is {choice!r}; use kubernetes, stdout, jsonl:<path> or none"
    )


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

    def _send(self, record: dict[str, Any]) -> None:
        if self._broken:
            return
        try:
            self.sink.send(record)
        except Exception as exc:  # noqa: BLE001 - a full disk or a closed pipe must not stop training
            self._broken = True
            log.warning(
                "progress sink %s failed (%s); progress is no longer reported",
                type(self.sink).__name__,
                describe_failure(exc),
            )

    def event(self, event: str, **fields: Any) -> None:
        self._send({"event": event, "time": utc_now(), **fields})

    def progress_due(self) -> bool:
        return self._last_progress is None or self.clock() - self._last_progress >= self.interval

    def progress(self, **fields: Any) -> None:
        self._last_progress = self.clock()
        self.event(EVENT_PROGRESS, **fields)

    def close(self) -> None:
        try:
            self.sink.close()
        except Exception as exc:  # noqa: BLE001 - a sink failing to close must not stop training either
            if not self._broken:
                log.warning(
                    "progress sink %s failed while closing (%s)", type(self.sink).__name__, describe_failure(exc)
                )


class ThroughputMeter:
    """Images per second over all ranks, leaving out warm-up batches and the time between epochs."""

    def __init__(self, warmup_batches: int = WARMUP_BATCHES, clock: Callable[[], float] = time.monotonic) -> None:
        self.warmup_batches = warmup_batches
        self.clock = clock
        self._batches = 0
        self._images = 0
        self._seconds = 0.0
        self._mark: float | None = None

    def epoch_start(self) -> None:
        self._mark = self.clock()

    def batch_done(self, images: int) -> None:
        now = self.clock()
        elapsed = 0.0 if self._mark is None else now - self._mark
        self._mark = now
        self._batches += 1
        if self._batches > self.warmup_batches:
            self._images += images
            self._seconds += elapsed

    def images_per_second(self) -> float | None:
        if self._images == 0 or self._seconds <= 0:
            return None
        return self._images / self._seconds


def batch_size_of(batch: Any) -> int | None:
    """Samples in a batch: the leading dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size_of(batch[0])
    if isinstance(batch, Mapping) and batch:
        return batch_size_of(next(iter(batch.values())))
    return None


def loss_of(outputs: Any) -> torch.Tensor | None:
    if isinstance(outputs, torch.Tensor):
        return outputs.detach()
    if isinstance(outputs, Mapping) and isinstance(outputs.get("loss"), torch.Tensor):
        return outputs["loss"].detach()
    return None


class _ProgressBehaviour:
    """Rank 0's reports of progress and of the checkpoint a run resumed from.

    The loss is read from the GPU (a synchronisation) only when a record is sent.
    """

    def __init__(
        self,
        reporter: ProgressReporter,
        default_batch_size: int,
        meter: ThroughputMeter | None = None,
        metric_names: Sequence[str] = (),
    ):
        self.reporter = reporter
        self.metric_names = tuple(metric_names)
        self.default_batch_size = default_batch_size
        self.meter = meter or ThroughputMeter()
        self._loss: torch.Tensor | None = None
        self.last_loss: float | None = None
        self._window_sum: torch.Tensor | None = None
        self._window_batches = 0
        self._window_step: int | None = None
        self.total_steps: int | None = None
        # The epoch of the latest batch: after fit, Lightning's current_epoch is one past the last epoch.
        self.last_epoch: int | None = None
        # Training and validation batches completed in this process, and when the latest did.
        self.batches = 0
        self.batch_time: str | None = None
        self._stage = contract.PROGRESS_STAGE_TRAINING
        # The latest comparison of the ranks' step times (dtrain_trainer.stragglers).
        self.step_times: dict[str, Any] | None = None
        self._trainer: Any = None
        self._stage_before_write = contract.PROGRESS_STAGE_TRAINING

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        step = checkpoint.get("global_step")
        log.info("resumed from %s at step %s", trainer.ckpt_path, step)
        if trainer.is_global_zero:
            self.reporter.event(EVENT_RESUMED, path=str(trainer.ckpt_path), step=step, epoch=checkpoint.get("epoch"))

    def note_step_times(self, times: dict[str, Any], now: bool) -> None:
        """The stragglers callback's latest comparison; `now`: a straggler appeared or went, report at once."""
        self.step_times = times
        if now and self._trainer is not None:
            self._report(self._trainer, epoch_end=False)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trainer = trainer
        self._window_step = trainer.global_step
        estimated = trainer.estimated_stepping_batches
        self.total_steps = int(estimated) if math.isfinite(estimated) else None

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.meter.epoch_start()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        self._batch_done()
        per_rank = batch_size_of(batch) or self.default_batch_size
        self.meter.batch_done(per_rank * trainer.world_size)
        self._add_loss(trainer, loss_of(outputs))
        self.last_epoch = trainer.current_epoch
        if self.reporter.progress_due() or self._stage != contract.PROGRESS_STAGE_TRAINING:
            self._stage = contract.PROGRESS_STAGE_TRAINING
            self._report(trainer, epoch_end=False)

    def _batch_done(self) -> None:
        self.batches += 1
        self.batch_time = utc_now()

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not trainer.is_global_zero:
            return
        self._batch_done()
        if self.reporter.progress_due() or self._stage != contract.PROGRESS_STAGE_VALIDATING:
            self._stage = contract.PROGRESS_STAGE_VALIDATING
            self._report(trainer, epoch_end=False)

    def checkpoint_writing(self, writing: bool) -> None:
        """A checkpoint write starts (True) or ends (False): say so at once, so that a long write trips no
        progress deadline and the deadline runs again from the moment it ends (StepCheckpoint calls this)."""
        trainer = self._trainer
        if trainer is None or not trainer.is_global_zero:
            return
        if writing:
            if self._stage != contract.PROGRESS_STAGE_CHECKPOINTING:
                self._stage_before_write = self._stage
                self._stage = contract.PROGRESS_STAGE_CHECKPOINTING
                self._report(trainer, epoch_end=False)
        elif self._stage == contract.PROGRESS_STAGE_CHECKPOINTING:
            self._stage = self._stage_before_write
            self._report(trainer, epoch_end=False)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self._report(trainer, epoch_end=True)

    def _add_loss(self, trainer: L.Trainer, normalised: torch.Tensor | None) -> None:
        """Average the model's own loss over the accumulation window; publish it at each optimizer step.

        Lightning hands on_train_batch_end the loss divided by accumulate_grad_batches (what it
        back-propagates); the model computed that times accumulate_grad_batches.
        """
        if normalised is None:
            return
        loss = normalised * trainer.accumulate_grad_batches
        self._window_sum = loss if self._window_sum is None else self._window_sum + loss
        self._window_batches += 1
        if trainer.global_step != self._window_step:
            self._window_step = trainer.global_step
            self._loss = self._window_sum / self._window_batches
            self._window_sum, self._window_batches = None, 0

    def _read_loss(self) -> None:
        if self._loss is not None:
            value = float(self._loss.float().item())
            self.last_loss = value if math.isfinite(value) else None
            self._loss = None

    def metrics(self, trainer: L.Trainer) -> dict[str, float]:
        """val_loss, val_acc, what the model logs with prog_bar=True and spec.logging.metrics: latest values."""
        shown = trainer.progress_bar_metrics
        logged = trainer.callback_metrics
        names = dict.fromkeys([*REPORTED_METRICS, *shown, *self.metric_names])
        found: dict[str, float] = {}
        for name in names:
            value = shown.get(name, logged.get(name))
            if name == "loss" or value is None:
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                found[name] = number
        return found

    def _report(self, trainer: L.Trainer, epoch_end: bool) -> None:
        self._read_loss()
        metrics = self.metrics(trainer)
        self.reporter.progress(
            epoch=trainer.current_epoch,
            step=trainer.global_step,
            totalSteps=self.total_steps,
            loss=self.last_loss,
            imagesPerSecond=self.meter.images_per_second(),
            epochEnd=epoch_end,
            stage=self._stage,
            metrics=metrics,
            validation=validation_text(metrics),
            batches=self.batches,
            batchTime=self.batch_time,
            stepTimes=self.step_times,
        )

    def final_metrics(self, trainer: L.Trainer) -> dict[str, Any]:
        self._read_loss()
        return {
            "loss": self.last_loss,
            "step": trainer.global_step,
            "epoch": self.last_epoch if self.last_epoch is not None else trainer.current_epoch,
            "imagesPerSecond": self.meter.images_per_second(),
            "metrics": (metrics := self.metrics(trainer)),
            "validation": validation_text(metrics),
        }


class ProgressCallback(_ProgressBehaviour, L.Callback):
    __doc__ = _ProgressBehaviour.__doc__


@functools.cache
def progress_callback_class(package: str) -> type:
    """ProgressCallback on `package`'s Callback (lightning.pytorch or pytorch_lightning)."""
    if package == flavor.LIGHTNING:
        return ProgressCallback
    base = flavor.flavor(package).Callback
    return type("ProgressCallback", (_ProgressBehaviour, base), {"__module__": __name__})
