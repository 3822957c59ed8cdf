"""Operator scale: many DistributedTrainings at once against the operator, over HTTP, counted.

`dtrain operator` runs as its own process, as in its Deployment, against the API server the
operator's tests use (tests/operator/apiserver.py: kmock's KubernetesEmulator with
resourceVersions, label selectors, a watch cache and a recorder of every request by user
agent), served on a local port. The benchmark creates jobs of 4 worker pods each in bursts,
and plays the kubelet: as soon as all pods of a job exist, it marks them Running. It measures

1. **create → pods**: from the moment the API server stores a DistributedTraining to the
   moment it stores the job's last worker pod (both on the API server's clock); and the
   time until every job has all its pods;
2. **all pods Running → job Running**: from the kubelet's last pod update of a job to the
   moment the operator reports the job `Running`.

Then it waits until the operator has been quiet for a while and counts the operator's
requests per job by kind, against the minimum the design needs for this lifecycle:
a Service, a ConfigMap, N pods, and one status patch and one patch of the operator's own
record (the dtrain.dev/state annotation) per phase the job passes through (Pending, Running).
Leader election's Lease renewals are the operator's, not a job's: they are not counted. The operator's CPU seconds and peak resident memory (VmHWM) come
from /proc through psutil.

The operator runs with its shipped defaults (the Helm chart's and manifests' --qps 500,
--burst 1000) unless --operator-args says otherwise.

    python -m bench.operator_scale                # 200 jobs x 4 nodes, bursts of 50
    python -m bench.operator_scale --large        # 1,000 jobs
    python -m bench.operator_scale --smoke        # 4 jobs x 2 nodes, seconds, for the tests
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import attrs
import kmock
import psutil

from dtrain_operator.api import contract
from tests.builders import a_cpu_job
from tests.operator.apiserver import ApiServer
from tests.operator.cluster import OPERATOR_AGENTS, Cluster, OperatorProcess

from .common import machine, markdown_table, percentile, write_results

TARGET_P99_SECONDS = 2.0
TARGET_REQUEST_RATIO = 1.5
TARGET_RSS_MIB = 300.0
QUIET_SECONDS = 3.0
NAMESPACES = ("team-a", "team-b")
SHIPPED_DEFAULTS = ("--log-level=INFO", "--qps=500", "--burst=1000", "--watch-timeout=300")


@attrs.define(kw_only=True)
class TimedApiServer(ApiServer):
    """The test API server, noting when each object was first stored and each job first reached a phase."""

    added_at: dict[tuple[str, str | None, str], float] = attrs.field(factory=dict, init=False)
    phase_at: dict[tuple[str | None, str, str], float] = attrs.field(factory=dict, init=False)

    def _emit(self, event_type: str, resource: Any, raw: dict[str, Any]) -> None:
        now = time.monotonic()
        meta = raw.get("metadata") or {}
        key = (resource.plural, meta.get("namespace"), meta.get("name", ""))
        if event_type == "ADDED":
            self.added_at.setdefault(key, now)
        if resource.plural == contract.PLURAL:
            phase = (raw.get("status") or {}).get("phase")
            if phase:
                self.phase_at.setdefault((meta.get("namespace"), meta.get("name", ""), phase), now)
        super()._emit(event_type, resource, raw)


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


class ProcessSampler:
    """Peak RSS (the kernel's high-water mark) and CPU time of one process."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)

    def cpu_seconds(self) -> float:
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def peak_rss_mib(self) -> float:
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return float(self.process.memory_info().rss) / 2**20

    def rss_mib(self) -> float:
        return float(self.process.memory_info().rss) / 2**20


def job_document(ref: JobRef, nodes: int) -> dict[str, Any]:
    return a_cpu_job(ref.name).in_namespace(ref.namespace).with_nodes(nodes).as_dict()


def jobs_of(count: int) -> list[JobRef]:
    return [JobRef(NAMESPACES[i % len(NAMESPACES)], f"bench-{i:04d}") for i in range(count)]


async def wait_until(check: Any, what: str, timeout: float, operator: OperatorProcess, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if not operator.running:
            raise SystemExit(f"the operator exited while waiting for {what}:\n{operator.log_tail()}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}\n{operator.log_tail(30)}")
        await asyncio.sleep(interval)


async def quiet(api: ApiServer, seconds: float) -> None:
    """Until the operator has made no request for `seconds` (Lease renewals aside)."""
    count, since = -1, time.monotonic()
    while True:
        now_count = sum(1 for _, call in api.calls if call.resource != "leases")
        if now_count != count:
            count, since = now_count, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return
        await asyncio.sleep(0.1)


def operator_calls(api: ApiServer, start: int) -> collections.Counter[str]:
    counter: collections.Counter[str] = collections.Counter()
    for agent, call in api.calls[start:]:
        if agent.startswith(OPERATOR_AGENTS) and call.resource != "leases":
            counter[f"{call.verb} {call.rbac_resource}"] += 1
    return counter


async def play_kubelet(
    cluster: Cluster,
    jobs: list[JobRef],
    nodes: int,
    pods_done_at: Callable[[JobRef], float | None],
    all_running_at: dict[str, float],
) -> None:
    """Mark every pod of a job Running once all of them exist; note when the last one was marked."""

    async def start(job: JobRef) -> None:
        await asyncio.gather(*(cluster.run(job.namespace, pod) for pod in job.pod_names(nodes)))
        all_running_at[job.name] = time.monotonic()

    waiting = list(jobs)
    while waiting:
        ready = [job for job in waiting if pods_done_at(job) is not None]
        if ready:
            waiting = [job for job in waiting if pods_done_at(job) is None]
            await asyncio.gather(*(start(job) for job in ready))
        else:
            await asyncio.sleep(0.05)


async def run_scenario(scenario: Scenario, workdir: Path) -> dict[str, Any]:
    jobs = jobs_of(scenario.jobs)
    this_process = ProcessSampler(os.getpid())
    async with TimedApiServer() as api, kmock.Server(api):
        api.declare_resources()
        cluster = Cluster(api, workdir)
        operator = await cluster.start_operator(*scenario.operator_args)
        try:
            return await measure(scenario, jobs, api, cluster, operator, this_process)
        finally:
            await asyncio.to_thread(operator.stop)  # the API server runs in this loop


async def measure(
    scenario: Scenario,
    jobs: list[JobRef],
    api: TimedApiServer,
    cluster: Cluster,
    operator: OperatorProcess,
    this_process: ProcessSampler,
) -> dict[str, Any]:
    assert operator.process is not None
    sampler = ProcessSampler(operator.process.pid)
    await quiet(api, 1.0)
    calls_at_start = len(api.calls)
    cpu_at_start = sampler.cpu_seconds()
    rss_at_start = sampler.rss_mib()
    server_cpu_at_start = this_process.cpu_seconds()
    nodes = scenario.nodes
    # Generous: at the operator's request rate limit every job needs about nodes + 4 requests.
    timeout = 120.0 + 3.0 * scenario.jobs * (nodes + 4) / operator_qps(scenario.operator_args)

    def pods_done_at(job: JobRef) -> float | None:
        times = [api.added_at.get(("pods", job.namespace, name)) for name in job.pod_names(nodes)]
        return None if None in times else max(t for t in times if t is not None)

    # The kubelet starts each job's pods as soon as all of them exist (a gang is scheduled together),
    # while jobs are still being created, as a cluster's kubelets would.
    all_running_at: dict[str, float] = {}
    kubelet = asyncio.create_task(play_kubelet(cluster, jobs, nodes, pods_done_at, all_running_at))

    def kubelet_failed() -> bool:
        return kubelet.done() and not kubelet.cancelled() and kubelet.exception() is not None

    started = time.monotonic()
    for first in range(0, len(jobs), scenario.burst_size):
        burst = jobs[first : first + scenario.burst_size]
        await asyncio.gather(*(cluster.create(job_document(job, nodes)) for job in burst))
        if first + scenario.burst_size < len(jobs):
            await asyncio.sleep(scenario.burst_interval)

    await wait_until(
        lambda: all(pods_done_at(job) is not None for job in jobs) or kubelet_failed(),
        f"all pods of {len(jobs)} jobs",
        timeout,
        operator,
    )
    await wait_until(
        lambda: all((job.namespace, job.name, "Running") in api.phase_at for job in jobs) or kubelet_failed(),
        f"all {len(jobs)} jobs Running",
        timeout,
        operator,
    )
    await kubelet  # raises what the kubelet met, if anything
    created = {job.name: api.added_at[(contract.PLURAL, job.namespace, job.name)] for job in jobs}
    pods_done = {job.name: pods_done_at(job) or 0.0 for job in jobs}
    create_to_pods = [pods_done[job.name] - created[job.name] for job in jobs]
    all_pods_after = max(pods_done.values()) - started
    to_running = [api.phase_at[(job.namespace, job.name, "Running")] - all_running_at[job.name] for job in jobs]
    await quiet(api, QUIET_SECONDS)

    calls = operator_calls(api, calls_at_start)
    operator_cpu = sampler.cpu_seconds() - cpu_at_start
    server_cpu = this_process.cpu_seconds() - server_cpu_at_start
    peak_rss = sampler.peak_rss_mib()
    errors = sum(1 for line in operator.log.read_text(errors="replace").splitlines() if " ERROR " in line)
    per_job = {kind: count / len(jobs) for kind, count in sorted(calls.items())}
    status_patches = per_job.get(f"patch {contract.PLURAL}/status", 0.0)
    minimum = {
        "create services": 1,
        "create configmaps": 1,
        "create pods": nodes,
        f"patch {contract.PLURAL}/status": 2,
        f"patch {contract.PLURAL}": 2,
    }
    requests_per_job = sum(calls.values()) / len(jobs)
    minimum_per_job = sum(minimum.values())
    return {
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
        "requests_per_job_by_kind": per_job,
        "minimum_by_kind": minimum,
        "operator_cpu_seconds": operator_cpu,
        "operator_rss_mib_before_jobs": rss_at_start,
        "operator_peak_rss_mib": peak_rss,
        "api_server_and_benchmark_cpu_seconds": server_cpu,
        "operator_error_log_lines": errors,
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


def tables(result: dict[str, Any]) -> str:
    scenario = result["scenario"]
    pods, running = result["create_to_pods_seconds"], result["pods_running_to_job_running_seconds"]
    ratio = result["request_ratio"]
    rss = result["operator_peak_rss_mib"]
    rss_target = f"< {TARGET_RSS_MIB:.0f} MiB at 1,000 jobs"
    header = (
        f"{scenario['jobs']} DistributedTrainings x {scenario['nodes']} nodes, created in bursts of "
        f"{scenario['burst_size']} every {scenario['burst_interval']} s; operator flags: "
        f"{' '.join(scenario['operator_args'])}"
    )
    summary = markdown_table(
        ["measure", "value", "target"],
        [
            ["create → all pods of the job, p50 (s)", pods["p50"], ""],
            ["create → all pods of the job, p99 (s)", pods["p99"], f"< {TARGET_P99_SECONDS:g} s (200 jobs)"],
            ["until every job has all its pods (s)", result["all_jobs_have_pods_after_seconds"], ""],
            ["all pods Running → job Running, p50 / p99 (s)", f"{running['p50']:.3g} / {running['p99']:.3g}", ""],
            ["operator API requests per job", result["requests_per_job"], ""],
            ["minimum the design needs per job", result["minimum_requests_per_job"], ""],
            ["requests / minimum", ratio, f"<= {TARGET_REQUEST_RATIO:g}"],
            ["status patches per job", result["status_patches_per_job"], ""],
            ["operator CPU seconds (first job to the end)", result["operator_cpu_seconds"], ""],
            ["operator peak RSS (MiB)", rss, rss_target],
            ["API server + benchmark CPU seconds (same run)", result["api_server_and_benchmark_cpu_seconds"], ""],
            ["operator ERROR log lines", result["operator_error_log_lines"], "0"],
        ],
    )
    minimum = result["minimum_by_kind"]
    kinds = sorted(set(result["requests_per_job_by_kind"]) | set(minimum))
    breakdown = markdown_table(
        ["request", "per job", "minimum per job"],
        [[kind, result["requests_per_job_by_kind"].get(kind, 0.0), minimum.get(kind, 0)] for kind in kinds],
    )
    return f"{header}\n\n{summary}\n\nOperator requests by kind:\n\n{breakdown}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_scale", description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="4 jobs x 2 nodes: seconds, for the tests")
    size.add_argument("--large", action="store_true", help="1,000 jobs instead of 200")
    parser.add_argument("--jobs", type=int, help="number of DistributedTrainings (default 200; --large 1,000)")
    parser.add_argument("--nodes", type=int, help="worker pods per job (default 4)")
    parser.add_argument("--burst-size", type=int, help="jobs created at once (default 50; --large 100)")
    parser.add_argument("--burst-interval", type=float, default=1.0, help="seconds between bursts (default 1)")
    parser.add_argument(
        "--operator-args",
        default="",
        help="extra `dtrain operator` flags, e.g. '--qps=500 --burst=500' (default: none, the shipped defaults)",
    )
    parser.add_argument("--workdir", help="keep the kubeconfig and the operator's log here")
    parser.add_argument("--out", help="results JSON (default bench/results/operator_scale.json)")
    return parser.parse_args(argv)


def scenario_from(args: argparse.Namespace) -> Scenario:
    if args.smoke:
        jobs, nodes, burst = 4, 2, 2
    elif args.large:
        jobs, nodes, burst = 1000, 4, 100
    else:
        jobs, nodes, burst = 200, 4, 50
    # The test bench starts the operator with test settings (DEBUG logs, a high rate limit, short
    # watches); these put back the shipped defaults, which --operator-args can override in turn.
    operator_args = (*SHIPPED_DEFAULTS, *shlex.split(args.operator_args))
    return Scenario(
        jobs=args.jobs or jobs,
        nodes=args.nodes or nodes,
        burst_size=args.burst_size or burst,
        burst_interval=args.burst_interval,
        operator_args=operator_args,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    scenario = scenario_from(args)
    where = machine()
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-operator-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result = asyncio.run(run_scenario(scenario, workdir))
    print(tables(result))
    path = write_results("operator_scale", {"machine": where, **result}, args.out)
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
