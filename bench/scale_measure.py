"""One run of bench/operator_scale.py measured: the jobs created in bursts, the kubelet played, the waits,
and the operator's requests, reconciles, CPU and memory counted against the minimum the design needs."""

from __future__ import annotations

import asyncio
import collections
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from dtrain_operator.api import contract
from tests.builders import a_cpu_job
from tests.operator.cluster import OperatorProcess

from .common import percentile
from .scale_api import ApiUnderTest, ProcessSampler

TARGET_P99_SECONDS = 2.0
TARGET_REQUEST_RATIO = 1.5
TARGET_RSS_MIB = 300.0
QUIET_SECONDS = 3.0
NAMESPACES = ("team-a", "team-b")


@dataclass(frozen=True)
class Scenario:
    jobs: int
    nodes: int
    burst_size: int
    burst_interval: float
    operator_args: tuple[str, ...]


@dataclass
class JobRef:
    namespace: str
    name: str

    def pod_names(self, nodes: int) -> list[str]:
        return [f"{self.name}-{rank}" for rank in range(nodes)]


def job_document(ref: JobRef, nodes: int) -> dict[str, Any]:
    return a_cpu_job(ref.name).in_namespace(ref.namespace).with_nodes(nodes).as_dict()


def jobs_of(count: int) -> list[JobRef]:
    return [JobRef(NAMESPACES[i % len(NAMESPACES)], f"bench-{i:04d}") for i in range(count)]


async def wait_until(
    check: Any, what: str, timeout: float, api: ApiUnderTest, operator: OperatorProcess, interval: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        api.check()
        if not operator.running:
            raise SystemExit(f"the operator exited while waiting for {what}:\n{operator.log_tail()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}\n{operator.log_tail(30)}")
        await asyncio.sleep(interval)


async def quiet(api: ApiUnderTest, seconds: float) -> None:
    """Until the operator has made no request for `seconds` (Lease renewals aside)."""
    count, since = -1, time.monotonic()
    while True:
        now_count = len(api.operator_requests())
        if now_count != count:
            count, since = now_count, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return
        await asyncio.sleep(0.1)


@dataclass(frozen=True)
class OperatorCounts:
    """What the operator's metrics endpoint (controller/metrics.py) counted so far, from one scrape."""

    requests: collections.Counter[str]
    """dtrain_api_requests by "verb resource", Leases aside: dtrain's client; kopf's own requests are not in it."""
    reconciles: int
    """dtrain_reconcile_duration_seconds' count."""


def operator_counts(operator: OperatorProcess) -> OperatorCounts:
    with urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    requests: collections.Counter[str] = collections.Counter()
    reconciles = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if family.name == "dtrain_api_requests":
                if sample.name.endswith("_total") and sample.labels["resource"] != "leases":
                    requests[f"{sample.labels['verb']} {sample.labels['resource']}"] += int(sample.value)
            elif family.name == "dtrain_reconcile_duration_seconds" and sample.name.endswith("_count"):
                reconciles += int(sample.value)
    return OperatorCounts(requests, reconciles)


async def play_kubelet(
    api: ApiUnderTest,
    jobs: list[JobRef],
    nodes: int,
    pods_done_at: Callable[[JobRef], float | None],
    all_running_at: dict[str, float],
) -> None:
    """Mark every pod of a job Running once all of them exist; note when the last one was marked."""

    async def start(job: JobRef) -> None:
        await asyncio.gather(*(api.run_pod(job.namespace, pod) for pod in job.pod_names(nodes)))
        all_running_at[job.name] = time.monotonic()

    waiting = list(jobs)
    while waiting:
        ready = [job for job in waiting if pods_done_at(job) is not None]
        if ready:
            waiting = [job for job in waiting if pods_done_at(job) is None]
            await asyncio.gather(*(start(job) for job in ready))
        else:
            await asyncio.sleep(0.05)



async def measure(
    scenario: Scenario,
    jobs: list[JobRef],
    api: ApiUnderTest,
    operator: OperatorProcess,
) -> dict[str, Any]:
    assert operator.process is not None
    sampler = ProcessSampler(operator.process.pid)
    await quiet(api, 1.0)
    requests_at_start = len(api.operator_requests())
    counted_at_start = await asyncio.to_thread(operator_counts, operator)
    events_at_start = api.job_events
    cpu_at_start = sampler.cpu_seconds()
    rss_at_start = sampler.rss_mib()
    api.start_cpu_clock()
    nodes = scenario.nodes
    # Generous: at the operator's request rate limit every job needs about nodes + 4 requests.
    timeout = 120.0 + 3.0 * scenario.jobs * (nodes + 4) / operator_qps(scenario.operator_args)

    def pods_done_at(job: JobRef) -> float | None:
        times = [api.added_at.get(("pods", job.namespace, name)) for name in job.pod_names(nodes)]
        return None if None in times else max(t for t in times if t is not None)

    # The kubelet starts each job's pods as soon as all of them exist (a gang is scheduled together),
    # while jobs are still being created, as a cluster's kubelets would.
    all_running_at: dict[str, float] = {}
    kubelet = asyncio.create_task(play_kubelet(api, jobs, nodes, pods_done_at, all_running_at))

    def kubelet_failed() -> bool:
        return kubelet.done() and not kubelet.cancelled() and kubelet.exception() is not None

    started = time.monotonic()
    for first in range(0, len(jobs), scenario.burst_size):
        burst = jobs[first : first + scenario.burst_size]
        await asyncio.gather(*(api.create(job_document(job, nodes)) for job in burst))
        if first + scenario.burst_size < len(jobs):
            await asyncio.sleep(scenario.burst_interval)

    await wait_until(
        lambda: all(pods_done_at(job) is not None for job in jobs) or kubelet_failed(),
        f"all pods of {len(jobs)} jobs",
        timeout,
        api,
        operator,
    )
    await wait_until(
        lambda: all((job.namespace, job.name, "Running") in api.phase_at for job in jobs) or kubelet_failed(),
        f"all {len(jobs)} jobs Running",
        timeout,
        api,
        operator,
    )
    await kubelet  # raises what the kubelet met, if anything
    created = {job.name: api.added_at[(contract.PLURAL, job.namespace, job.name)] for job in jobs}
    pods_done = {job.name: pods_done_at(job) or 0.0 for job in jobs}
    create_to_pods = [pods_done[job.name] - created[job.name] for job in jobs]
    all_pods_after = max(pods_done.values()) - started
    to_running = [api.phase_at[(job.namespace, job.name, "Running")] - all_running_at[job.name] for job in jobs]
    await quiet(api, QUIET_SECONDS)

    calls = collections.Counter(api.operator_requests()[requests_at_start:])
    counted = await asyncio.to_thread(operator_counts, operator)
    own_count = counted.requests
    own_count.subtract(counted_at_start.requests)
    reconciles = counted.reconciles - counted_at_start.reconciles
    job_events = api.job_events - events_at_start
    operator_cpu = sampler.cpu_seconds() - cpu_at_start
    server_cpu = api.server_cpu_seconds()
    peak_rss = sampler.peak_rss_mib()
    errors = sum(1 for line in operator.log.read_text(errors="replace").splitlines() if " ERROR " in line)
    per_job = {kind: count / len(jobs) for kind, count in sorted(calls.items())}
    own_per_job = {kind: count / len(jobs) for kind, count in sorted(own_count.items()) if count}
    status_patches = per_job.get(f"patch {contract.PLURAL}/status", 0.0)
    minimum = {
        "create services": 1,
        "create configmaps": 1,
        "create pods": nodes,
        f"patch {contract.PLURAL}/status": 2,
    }
    requests_per_job = sum(calls.values()) / len(jobs)
    minimum_per_job = sum(minimum.values())
    return {
        "apiserver": {"kind": api.kind, "label": api.label},
        "scenario": asdict(scenario),
        "create_to_pods_seconds": {
            "p50": percentile(create_to_pods, 50),
            "p99": percentile(create_to_pods, 99),
            "max": max(create_to_pods),
        },
        "all_jobs_have_pods_after_seconds": all_pods_after,
        "pods_running_to_job_running_seconds": {
            "p50": percentile(to_running, 50),
            "p99": percentile(to_running, 99),
            "max": max(to_running),
        },
        "requests_per_job": requests_per_job,
        "minimum_requests_per_job": minimum_per_job,
        "request_ratio": requests_per_job / minimum_per_job,
        "status_patches_per_job": status_patches,
        "job_watch_events_per_job": job_events / len(jobs),
        "reconciles_per_job": reconciles / len(jobs),
        "requests_per_job_by_kind": per_job,
        "operator_metrics_requests_per_job_by_kind": own_per_job,
        "minimum_by_kind": minimum,
        "operator_cpu_seconds": operator_cpu,
        "operator_rss_mib_before_jobs": rss_at_start,
        "operator_peak_rss_mib": peak_rss,
        "server_cpu_seconds": server_cpu,
        "operator_error_log_lines": errors,
        "benchmark_watch_restarts": api.watch_restarts,
        "targets": {
            "p99_create_to_pods_seconds": TARGET_P99_SECONDS,
            "request_ratio": TARGET_REQUEST_RATIO,
            "rss_mib_at_1000_jobs": TARGET_RSS_MIB,
        },
    }


def operator_qps(args: tuple[str, ...]) -> float:
    qps = 500.0  # dtrain operator's default
    for arg in args:
        if arg.startswith("--qps="):
            qps = float(arg.split("=", 1)[1])
    return qps
