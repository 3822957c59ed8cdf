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
from tests.operator.operator_process import OperatorProcess

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



@dataclass(frozen=True)
class Before:
    """What was counted before the first job: where the run's counts start."""

    requests: int
    counted: OperatorCounts
    job_events: int
    cpu_seconds: float
    rss_mib: float


@dataclass(frozen=True)
class Timings:
    create_to_pods: list[float]
    all_pods_after: float
    to_running: list[float]


@dataclass(frozen=True)
class After:
    """What the run cost, counted once the operator is quiet again."""

    calls: collections.Counter[str]
    own_count: collections.Counter[str]
    reconciles: int
    job_events: int
    operator_cpu: float
    server_cpu: dict[str, float]
    peak_rss: float
    errors: int


async def measure(
    scenario: Scenario,
    jobs: list[JobRef],
    api: ApiUnderTest,
    operator: OperatorProcess,
) -> dict[str, Any]:
    assert operator.process is not None
    sampler = ProcessSampler(operator.process.pid)
    before = await counted_before(api, operator, sampler)
    timings = await run_jobs(scenario, jobs, api, operator)
    await quiet(api, QUIET_SECONDS)
    after = await counted_after(api, operator, sampler, before)
    return report(scenario, jobs, api, before, timings, after)


async def counted_before(api: ApiUnderTest, operator: OperatorProcess, sampler: ProcessSampler) -> Before:
    await quiet(api, 1.0)
    requests_at_start = len(api.operator_requests())
    counted_at_start = await asyncio.to_thread(operator_counts, operator)
    events_at_start = api.job_events
    cpu_at_start = sampler.cpu_seconds()
    rss_at_start = sampler.rss_mib()
    api.start_cpu_clock()
    return Before(requests_at_start, counted_at_start, events_at_start, cpu_at_start, rss_at_start)


async def run_jobs(scenario: Scenario, jobs: list[JobRef], api: ApiUnderTest, operator: OperatorProcess) -> Timings:
    """Create the jobs in bursts while the kubelet runs their pods; until every job is Running."""
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
    return Timings(create_to_pods, all_pods_after, to_running)


async def counted_after(api: ApiUnderTest, operator: OperatorProcess, sampler: ProcessSampler, before: Before) -> After:
    calls = collections.Counter(api.operator_requests()[before.requests:])
    counted = await asyncio.to_thread(operator_counts, operator)
    own_count = counted.requests
    own_count.subtract(before.counted.requests)
    reconciles = counted.reconciles - before.counted.reconciles
    job_events = api.job_events - before.job_events
    operator_cpu = sampler.cpu_seconds() - before.cpu_seconds
    server_cpu = api.server_cpu_seconds()
    peak_rss = sampler.peak_rss_mib()
    errors = sum(1 for line in operator.log.read_text(errors="replace").splitlines() if " ERROR " in line)
    return After(calls, own_count, reconciles, job_events, operator_cpu, server_cpu, peak_rss, errors)


def minimum_requests(nodes: int) -> dict[str, int]:
    """The requests per job the design needs for this lifecycle: a Service, the pods, and one status patch per
    phase the job passes through (Pending, Running)."""
    return {
        "create services": 1,
        "create pods": nodes,
        f"patch {contract.PLURAL}/status": 2,
    }


def report(
    scenario: Scenario, jobs: list[JobRef], api: ApiUnderTest, before: Before, timings: Timings, after: After
) -> dict[str, Any]:
    per_job = {kind: count / len(jobs) for kind, count in sorted(after.calls.items())}
    own_per_job = {kind: count / len(jobs) for kind, count in sorted(after.own_count.items()) if count}
    status_patches = per_job.get(f"patch {contract.PLURAL}/status", 0.0)
    minimum = minimum_requests(scenario.nodes)
    requests_per_job = sum(after.calls.values()) / len(jobs)
    minimum_per_job = sum(minimum.values())
    create_to_pods, to_running = timings.create_to_pods, timings.to_running
    return {
        "apiserver": {"kind": api.kind, "label": api.label},
        "scenario": asdict(scenario),
        "create_to_pods_seconds": {
            "p50": percentile(create_to_pods, 50),
            "p99": percentile(create_to_pods, 99),
            "max": max(create_to_pods),
        },
        "all_jobs_have_pods_after_seconds": timings.all_pods_after,
        "pods_running_to_job_running_seconds": {
            "p50": percentile(to_running, 50),
            "p99": percentile(to_running, 99),
            "max": max(to_running),
        },
        "requests_per_job": requests_per_job,
        "minimum_requests_per_job": minimum_per_job,
        "request_ratio": requests_per_job / minimum_per_job,
        "status_patches_per_job": status_patches,
        "job_watch_events_per_job": after.job_events / len(jobs),
        "reconciles_per_job": after.reconciles / len(jobs),
        "requests_per_job_by_kind": per_job,
        "operator_metrics_requests_per_job_by_kind": own_per_job,
        "minimum_by_kind": minimum,
        "operator_cpu_seconds": after.operator_cpu,
        "operator_rss_mib_before_jobs": before.rss_mib,
        "operator_peak_rss_mib": after.peak_rss,
        "server_cpu_seconds": after.server_cpu,
        "operator_error_log_lines": after.errors,
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
