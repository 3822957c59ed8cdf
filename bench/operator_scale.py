"""Operator scale: many DistributedTrainings at once against the operator, over HTTP, counted.

`dtrain operator` runs as its own process, as in its Deployment, with an admin kubeconfig, against
one of two API servers (--apiserver):

- `real` (the default): upstream kube-apiserver and etcd, the control plane `make cluster` runs
  (tools/cluster/controlplane's binary), started for the run on ports and in a state directory of
  their own, and stopped at its end (tests/control_plane.py, as for the tests). Only those two: no scheduler,
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
a Service, N pods, and one status patch (the status is the operator's record of
the job) per phase the job passes through (Pending, Running).
Beside the server's count, the operator's own (its metrics endpoint's dtrain_api_requests: the
requests of dtrain's client; kopf's own are not in it). Leader election's Lease renewals are the
operator's, not a job's: they are not counted. Beside them, what the work queue buys: the watch
events of the jobs and their pods (what an operator reconciling on every event would handle) and
the reconciles the operator ran (its dtrain_reconcile_duration_seconds count), per job. The
operator's CPU seconds and peak resident memory (VmHWM) come from /proc through psutil.

The operator runs with its shipped defaults (the Helm chart's and manifests' --qps 500,
--burst 1000) unless --operator-args says otherwise.

Its parts: bench/scale_api.py (the emulator and what the benchmark needs of a server), bench/scale_measure.py
(one run measured) and bench/control_plane.py (the real server).

    python -m bench.operator_scale                # 200 jobs x 4 nodes, bursts of 50, on the real server
    python -m bench.operator_scale --apiserver emulator
    python -m bench.operator_scale --large        # 1,000 jobs
    python -m bench.operator_scale --smoke        # 4 jobs x 2 nodes, seconds, for the tests
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kmock

from tests.control_plane import ControlPlane, started

from . import control_plane
from .common import machine, markdown_table, write_results
from .scale_api import ApiUnderTest, EmulatedApi, TimedApiServer
from .scale_measure import (
    NAMESPACES,
    TARGET_P99_SECONDS,
    TARGET_REQUEST_RATIO,
    TARGET_RSS_MIB,
    Scenario,
    jobs_of,
    measure,
)

SHIPPED_DEFAULTS = ("--log-level=INFO", "--qps=500", "--burst=1000", "--watch-timeout=300")


async def run_on_emulator(scenario: Scenario, workdir: Path) -> dict[str, Any]:
    async with TimedApiServer() as server, kmock.Server(server):
        server.declare_resources()
        return await run_against(EmulatedApi(server, workdir), scenario)


async def run_on_real(scenario: Scenario, workdir: Path, plane: ControlPlane) -> dict[str, Any]:
    async with control_plane.RealApi(plane, workdir, NAMESPACES) as api:
        return await run_against(api, scenario)


async def run_against(api: ApiUnderTest, scenario: Scenario) -> dict[str, Any]:
    operator = await api.start_operator(scenario.operator_args)
    try:
        return await measure(scenario, jobs_of(scenario.jobs), api, operator)
    finally:
        await asyncio.to_thread(operator.stop)  # the emulator serves from this loop


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
            with started(workdir) as plane:
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
