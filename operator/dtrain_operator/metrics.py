"""The operator's Prometheus metrics, on their own registry and port (`--metrics-port`)."""

from __future__ import annotations

from typing import Optional, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from .api import Phase

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
            "dtrain_gang_restarts", "Gang restarts: every worker pod recreated after a worker failed", registry=self.registry
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
        for phase in PHASES:
            self.jobs.labels(phase).set(0)
        self._phases: dict[tuple[str, str], str] = {}
        self._counts: dict[str, int] = {phase: 0 for phase in PHASES}

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    def api_request(self, verb: str, resource: str, status: int) -> None:
        self.api_requests.labels(verb, resource, str(status)).inc()
        if status == 0 or status >= 400:
            self.api_errors.labels(verb, resource, str(status)).inc()

    def job_phase(self, key: tuple[str, str], phase: Optional[str]) -> None:
        """Record a job's phase (None: the job is gone or has no phase yet)."""
        old = self._phases.pop(key, None)
        if phase in self._counts:
            self._phases[key] = phase
        for changed, delta in ((old, -1), (phase, +1)):
            if changed in self._counts and old != phase:
                self._counts[changed] += delta
                self.jobs.labels(changed).set(self._counts[changed])
