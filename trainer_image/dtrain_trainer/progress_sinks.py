"""Where rank 0's progress records go (DTRAIN_PROGRESS_SINK, see dtrain_trainer.progress): stdout, a JSONL
file, the job's status through the Kubernetes API, or nowhere."""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dtrain_operator.api import contract
from dtrain_operator.api.records import Event, status_patch
from dtrain_trainer.config import ConfigError
from dtrain_trainer.progress import Sink, describe_failure

log = logging.getLogger("dtrain_trainer")

KUBERNETES_REQUEST_TIMEOUT_SECONDS = 5.0
SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


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
        return f"checkpoint at step {record.get('step')}: {record.get('path')}"
    if event == Event.RESUMED:
        return f"resumed from {record.get('path')} at step {record.get('step')}"
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
            # A missed checkpoint's patch adds to a pending saved one's rather than replacing it.
            checkpoint = patch.get("lastCheckpoint")
            if isinstance(checkpoint, dict) and isinstance(self._pending.get("lastCheckpoint"), dict):
                patch = {**patch, "lastCheckpoint": {**self._pending["lastCheckpoint"], **checkpoint}}
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

