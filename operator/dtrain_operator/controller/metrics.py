"""The operator's Prometheus metrics, on their own registry and port (`--metrics-port`).

Besides its own work (jobs by phase, reconciles, gang restarts by reason, API requests), the
operator exports each job's training progress from the status it already holds: images/s, loss,
step, restarts, the numeric `status.progress.metrics` (val_acc, ...) and the goodput by category (as the
operator counts it at each reconcile, fresher than status.goodput), one series per job,
labelled `job_namespace` and `job_name` (not `namespace`/`job`, which Prometheus's own target
labels would overwrite). A job's series go when the job does. The chart's Grafana dashboard
(helm/dtrain-operator/files/dashboards/) draws these; a test checks every query against them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from dtrain_operator.api import Goodput, Phase

PHASES = get_args(Phase)


class OperatorMetrics:
    """Jobs by phase, reconcile durations, gang restarts, API requests and errors."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.jobs = Gauge(
            "dtrain_jobs", "DistributedTrainings the operator sees, by phase", ["phase"], registry=self.registry
        )
        self.reconcile_seconds = Histogram(
            "dtrain_reconcile_duration_seconds",
            "Time to reconcile one DistributedTraining (status, then children)",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "dtrain_reconcile_errors", "Reconciles that failed and were retried with backoff", registry=self.registry
        )
        self.gang_restarts = Counter(
            "dtrain_gang_restarts",
            "Gang restarts: every worker pod recreated after a worker failed, by the reason of the Restarting condition",
            ["reason"],
            registry=self.registry,
        )
        self.api_requests = Counter(
            "dtrain_api_requests",
            "API requests the operator made (kopf's watches not included), by verb, resource and HTTP status",
            ["verb", "resource", "code"],
            registry=self.registry,
        )
        self.api_errors = Counter(
            "dtrain_api_errors",
            "API requests that failed (code 0: no answer), by verb, resource and HTTP status",
            ["verb", "resource", "code"],
            registry=self.registry,
        )
        self._job_series(["job_namespace", "job_name"])
        for phase in PHASES:
            self.jobs.labels(phase).set(0)
        self._phases: dict[tuple[str, str], str] = {}
        self._counts: dict[str, int] = {phase: 0 for phase in PHASES}

    def _job_series(self, job_labels: list[str]) -> None:
        """Each job's series, from its status: progress, restarts, metrics, goodput."""
        self.job_gauges: dict[str, Gauge] = {
            "imagesPerSecond": Gauge(
                "dtrain_job_images_per_second", "Training throughput of a job over all ranks (status.progress)",
                job_labels, registry=self.registry,
            ),
            "loss": Gauge("dtrain_job_loss", "Latest training loss of a job (status.progress)", job_labels,
                          registry=self.registry),
            "step": Gauge("dtrain_job_step", "Global optimizer step of a job (status.progress)", job_labels,
                          registry=self.registry),
            "epoch": Gauge("dtrain_job_epoch", "Current epoch of a job, from 0 (status.progress)", job_labels,
                           registry=self.registry),
            "restarts": Gauge("dtrain_job_restarts", "Gang restarts of a job so far (status.restarts)", job_labels,
                              registry=self.registry),
        }
        self.job_metric = Gauge(
            "dtrain_job_metric", "A metric the trainer reports for a job (status.progress.metrics, e.g. val_acc)",
            [*job_labels, "metric"], registry=self.registry,
        )
        self._job_metric_names: dict[tuple[str, str], set[str]] = {}
        self.job_goodput_seconds = Gauge(
            "dtrain_job_goodput_seconds",
            "Seconds of a job's life by goodput category: productive, redone, queued, starting, validating, "
            "checkpointing, stalled, restarting, exporting, engine (status.goodput)",
            [*job_labels, "category"], registry=self.registry,
        )
        self.job_goodput_ratio = Gauge(
            "dtrain_job_goodput_ratio", "Productive seconds of a job over all of them (status.goodput.ratio)",
            job_labels, registry=self.registry,
        )
        self._goodput_categories: dict[tuple[str, str], set[str]] = {}

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    def api_request(self, verb: str, resource: str, status: int) -> None:
        self.api_requests.labels(verb, resource, str(status)).inc()
        if status == 0 or status >= 400:
            self.api_errors.labels(verb, resource, str(status)).inc()

    def gang_restart(self, count: int, reason: str) -> None:
        self.gang_restarts.labels(reason or "Unknown").inc(count)

    def job_status(self, key: tuple[str, str], status: Mapping[str, Any] | None) -> None:
        """Record a job's status as the operator holds it (None: the job is gone)."""
        self.job_phase(key, (status or {}).get("phase") if status is not None else None)
        progress = (status or {}).get("progress") if status is not None else None
        progress = progress if isinstance(progress, Mapping) else {}
        values = {**progress, "restarts": (status or {}).get("restarts")} if status is not None else {}
        for field, gauge in self.job_gauges.items():
            value = values.get(field)
            if _is_number(value):
                gauge.labels(*key).set(float(value))  # type: ignore[arg-type]
            else:
                _remove(gauge, key)
        reported = progress.get("metrics")
        metrics: Mapping[str, Any] = reported if isinstance(reported, Mapping) else {}
        numbers = {str(k): float(v) for k, v in metrics.items() if _is_number(v)}
        _set_series(self.job_metric, key, numbers, self._job_metric_names)

    def job_goodput(self, key: tuple[str, str], goodput: Goodput | None) -> None:
        """Record a job's goodput as the operator counted it (None: the job is gone)."""
        _set_series(self.job_goodput_seconds, key, (goodput.seconds or {}) if goodput else {}, self._goodput_categories)
        if goodput is not None and goodput.ratio is not None:
            self.job_goodput_ratio.labels(*key).set(goodput.ratio)
        else:
            _remove(self.job_goodput_ratio, key)

    def job_phase(self, key: tuple[str, str], phase: str | None) -> None:
        """Record a job's phase (None: the job is gone or has no phase yet)."""
        old = self._phases.pop(key, None)
        if phase in self._counts:
            self._phases[key] = phase
        for changed, delta in ((old, -1), (phase, +1)):
            if changed in self._counts and old != phase:
                self._counts[changed] += delta
                self.jobs.labels(changed).set(self._counts[changed])


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and not math.isnan(value))


def _set_series(gauge: Gauge, key: tuple[str, str], values: Mapping[str, float], shown: dict[tuple[str, str], set[str]]) -> None:
    """A job's series of `gauge`, one per name in `values` (its last label); those it no longer has removed."""
    for gone in shown.pop(key, set()) - set(values):
        _remove(gauge, (*key, gone))
    for name, value in values.items():
        gauge.labels(*key, name).set(value)
    if values:
        shown[key] = set(values)


def _remove(gauge: Gauge, labels: tuple[str, ...]) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass
