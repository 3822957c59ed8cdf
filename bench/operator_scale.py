"""Operator scale: many DistributedTrainings at once against the operator, over HTTP, counted.

`dtrain operator` runs as its own process, as in its Deployment, with an admin kubeconfig, against
one of two API servers (--apiserver):

- `real` (the default): upstream kube-apiserver and etcd, the control plane `make cluster` runs
  (tools/cluster/controlplane's binary), started for the run on ports and in a state directory of
  their own, and stopped at its end (bench/control_plane.py). Only those two: no scheduler,
  controller manager or kubelet. The operator's requests are counted in kube-apiserver's audit log
  by user agent; objects arrive on watches the benchmark holds.
- `emulator`: the API server the operator's tests use (tests/operator/apiserver.py: kmock's
  KubernetesEmulator with resourceVersions, label selectors, a watch cache and a recorder of every
  request by user agent), served on a local port from the benchmark's process. No Go build needed:
  the smoke test runs this one.

The benchmark creates jobs of 4 worker pods each in bursts, and plays the kubelet: as soon as all
pods of a job exist, it marks them Running (pods/status, with the admin's credentials). It measures

1. **create → pods**: from the moment a DistributedTraining arrives to the moment the job's last
   worker pod arrives (on the emulator: as it stores them; on the real server: as the benchmark's
   watches see them); and the time until every job has all its pods;
2. **all pods Running → job Running**: from the kubelet's last pod update of a job to the
   moment the operator reports the job `Running`.

Then it waits until the operator has been quiet for a while and counts the operator's
requests per job by kind, against the minimum the design needs for this lifecycle:
a Service, a ConfigMap, N pods, and one status patch (the status is the operator's record of
the job) per phase the job passes through (Pending, Running).
Beside the server's count, the operator's own (its metrics endpoint's dtrain_api_requests: the
requests of dtrain's client; kopf's own are not in it). Leader election's Lease renewals are the
operator's, not a job's: they are not counted. Beside them, what the work queue buys: the watch
events of the jobs and their pods (what an operator reconciling on every event would handle) and
the reconciles the operator ran (its dtrain_reconcile_duration_seconds count), per job. The
operator's CPU seconds and peak resident memory (VmHWM) come from /proc through psutil.

The operator runs with its shipped defaults (the Helm chart's and manifests' --qps 500,
--burst 1000) unless --operator-args says otherwise.

    python -m bench.operator_scale                # 200 jobs x 4 nodes, bursts of 50, on the real server
    python -m bench.operator_scale --apiserver emulator
    python -m bench.operator_scale --large        # 1,000 jobs
    python -m bench.operator_scale --smoke        # 4 jobs x 2 nodes, seconds, for the tests
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shlex
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import attrs
import kmock
import psutil
from prometheus_client.parser import text_string_to_metric_families

from dtrain_operator.api import contract
from tests.builders import a_cpu_job
from tests.operator.apiserver import ApiServer
from tests.operator.cluster import OPERATOR_AGENTS, Cluster, OperatorProcess

from . import control_plane
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
    job_events: int = attrs.field(default=0, init=False)

    def _emit(self, event_type: str, resource: Any, raw: dict[str, Any]) -> None:
        now = time.monotonic()
        meta = raw.get("metadata") or {}
        key = (resource.plural, meta.get("namespace"), meta.get("name", ""))
        if resource.plural in (contract.PLURAL, "pods"):
            self.job_events += 1
        if event_type == "ADDED":
            self.added_at.setdefault(key, now)
        if resource.plural == contract.PLURAL:
            phase = (raw.get("status") or {}).get("phase")
            if phase:
                self.phase_at.setdefault((meta.get("namespace"), meta.get("name", ""), phase), now)
        super()._emit(event_type, resource, raw)


class ApiUnderTest(Protocol):
    """What the benchmark needs of the API server the operator runs against."""

    kind: str  # "real" or "emulator"
    label: str  # what it is, for the table
    added_at: dict[tuple[str, str | None, str], float]  # (plural, namespace, name): when it first appeared
    phase_at: dict[tuple[str | None, str, str], float]  # (namespace, name, phase): when a job first had it
    watch_restarts: int  # the benchmark's watches, ended by the server and resumed

    @property
    def job_events(self) -> int:
        """Watch events of the jobs and their pods so far: each one a handler call for an operator
        that reconciles on every event (kopf's handlers, without dtrain's work queue)."""
        ...

    def check(self) -> None:
        """Raise what failed on the benchmark's side of the server (a watch), if anything did."""
        ...

    async def start_operator(self, args: tuple[str, ...]) -> OperatorProcess: ...

    async def create(self, obj: dict[str, Any]) -> None: ...

    async def run_pod(self, namespace: str, name: str) -> None: ...

    def operator_requests(self) -> list[str]:
        """Every request of the operator so far, in order, as "verb resource[/subresource]", Leases aside."""
        ...

    def start_cpu_clock(self) -> None: ...

    def server_cpu_seconds(self) -> dict[str, float]:
        """CPU seconds since start_cpu_clock of what serves the API (and of the benchmark)."""
        ...


class EmulatedApi:
    """The API emulator of the operator's tests, served from this process, with its recorder."""

    kind = "emulator"
    label = "the API emulator of the operator's tests (tests/operator/apiserver.py, kmock), in the benchmark's process"

    def __init__(self, server: TimedApiServer, workdir: Path) -> None:
        self.server = server
        self.cluster = Cluster(server, workdir)
        self.added_at = server.added_at
        self.phase_at = server.phase_at
        self.watch_restarts = 0  # it notes arrivals as it stores them: the benchmark holds no watch
        self._process = ProcessSampler(psutil.Process().pid)
        self._cpu_at_start = 0.0

    @property
    def job_events(self) -> int:
        return self.server.job_events

    def check(self) -> None:
        pass

    async def start_operator(self, args: tuple[str, ...]) -> OperatorProcess:
        return await self.cluster.start_operator(*args)

    async def create(self, obj: dict[str, Any]) -> None:
        await self.cluster.create(obj)

    async def run_pod(self, namespace: str, name: str) -> None:
        await self.cluster.run(namespace, name)

    def operator_requests(self) -> list[str]:
        return [
            f"{call.verb} {call.rbac_resource}"
            for agent, call in self.server.calls
            if agent.startswith(OPERATOR_AGENTS) and call.resource != "leases"
        ]

    def start_cpu_clock(self) -> None:
        self._cpu_at_start = self._process.cpu_seconds()

    def server_cpu_seconds(self) -> dict[str, float]:
        return {"API emulator and benchmark (one process)": self._process.cpu_seconds() - self._cpu_at_start}


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


async def run_on_emulator(scenario: Scenario, workdir: Path) -> dict[str, Any]:
    async with TimedApiServer() as server, kmock.Server(server):
        server.declare_resources()
        return await run_against(EmulatedApi(server, workdir), scenario)


async def run_on_real(scenario: Scenario, workdir: Path, plane: control_plane.ControlPlane) -> dict[str, Any]:
    async with control_plane.RealApi(plane, workdir, NAMESPACES) as api:
        return await run_against(api, scenario)


async def run_against(api: ApiUnderTest, scenario: Scenario) -> dict[str, Any]:
    operator = await api.start_operator(scenario.operator_args)
    try:
        return await measure(scenario, jobs_of(scenario.jobs), api, operator)
    finally:
        await asyncio.to_thread(operator.stop)  # the emulator serves from this loop


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


def tables(result: dict[str, Any]) -> str:
    scenario = result["scenario"]
    pods, running = result["create_to_pods_seconds"], result["pods_running_to_job_running_seconds"]
    ratio = result["request_ratio"]
    rss = result["operator_peak_rss_mib"]
    rss_target = f"< {TARGET_RSS_MIB:.0f} MiB at 1,000 jobs"
    header = (
        f"{scenario['jobs']} DistributedTrainings x {scenario['nodes']} nodes, created in bursts of "
        f"{scenario['burst_size']} every {scenario['burst_interval']} s; operator flags: "
        f"{' '.join(scenario['operator_args'])}\nAPI server: {result['apiserver']['label']}"
    )
    server_cpu = [[f"{name} CPU seconds (same window)", seconds, ""] for name, seconds in result["server_cpu_seconds"].items()]
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
            ["watch events of the job and its pods, per job", result["job_watch_events_per_job"], ""],
            ["reconciles per job (the work queue coalesces events)", result["reconciles_per_job"], ""],
            ["operator CPU seconds (first job to the end)", result["operator_cpu_seconds"], ""],
            ["operator peak RSS (MiB)", rss, rss_target],
            *server_cpu,
            ["operator ERROR log lines", result["operator_error_log_lines"], "0"],
            ["the benchmark's watches, ended by the server and resumed", result["benchmark_watch_restarts"], ""],
        ],
    )
    minimum = result["minimum_by_kind"]
    by_kind, own = result["requests_per_job_by_kind"], result["operator_metrics_requests_per_job_by_kind"]
    kinds = sorted(set(by_kind) | set(minimum) | set(own))
    breakdown = markdown_table(
        ["request", "per job (the server's record)", "per job (the operator's metrics)", "minimum per job"],
        [[kind, by_kind.get(kind, 0.0), own.get(kind, 0.0), minimum.get(kind, 0)] for kind in kinds],
    )
    where = "the audit log, by user agent" if result["apiserver"]["kind"] == "real" else "its recorder, by user agent"
    return (
        f"{header}\n\n{summary}\n\nOperator requests by kind (the server's record: {where}; the operator's "
        f"metrics: dtrain_api_requests, dtrain's own client, kopf's requests not included):\n\n{breakdown}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.operator_scale", description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="4 jobs x 2 nodes: seconds, for the tests")
    size.add_argument("--large", action="store_true", help="1,000 jobs instead of 200")
    parser.add_argument(
        "--apiserver",
        choices=("real", "emulator"),
        default="real",
        help="real: upstream kube-apiserver and etcd, started for the run (the control plane's Go build when "
        "missing); emulator: the operator tests' API emulator (default: real)",
    )
    parser.add_argument("--jobs", type=int, help="number of DistributedTrainings (default 200; --large 1,000)")
    parser.add_argument("--nodes", type=int, help="worker pods per job (default 4)")
    parser.add_argument("--burst-size", type=int, help="jobs created at once (default 50; --large 100)")
    parser.add_argument("--burst-interval", type=float, default=1.0, help="seconds between bursts (default 1)")
    parser.add_argument(
        "--operator-args",
        default="",
        help="extra `dtrain operator` flags, e.g. '--qps=500 --burst=500' (default: none, the shipped defaults)",
    )
    parser.add_argument("--workdir", help="keep the kubeconfig, the operator's log and the control plane's state here")
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
    # A SIGTERM (a timeout's) unwinds like Ctrl-C, so that etcd, kube-apiserver and the operator are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    where = machine()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-operator-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.apiserver == "real":
            with control_plane.started(workdir) as plane:
                result = asyncio.run(run_on_real(scenario, workdir, plane))
        else:
            result = asyncio.run(run_on_emulator(scenario, workdir))
    result["wall_seconds"] = time.monotonic() - began
    print(tables(result))
    print(f"\nwhole run, API server start and stop included: {result['wall_seconds']:.0f} s")
    path = write_results("operator_scale", {"machine": where, **result}, args.out)
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
