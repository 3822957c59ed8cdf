"""The report endpoint under an idle-connection flood from one job's pods: the operator's memory and another job's
reports, bounded (the endpoint's limits, controller/report_limits.py) against unbounded (the same server with no
limits, as it was before them).

    .venv/bin/python -m bench.report_flood            # 3,000 idle TLS connections from 30 "pods"
    .venv/bin/python -m bench.report_flood --smoke    # 300 from 10: seconds, for the tests

The endpoint runs in a process of its own (`--serve`), as the operator does, with the operator's own
ReportServer, TLS and limits; the attacking "pods" are loopback addresses 127.0.1.x, each opening idle TLS
connections and holding them; an honest rank 0 on 127.0.2.1 sends a report meanwhile. Measured: the server
process's resident memory before and at the flood's height (RSS, from /proc), the connections it holds, and the
honest report's answer and latency. Target: bounded, memory flat (a few MiB) and the honest report answered 204.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, markdown_table, write_results
from dtrain_operator.api import contract
from dtrain_operator.controller.report_limits import ServingLimits
from dtrain_operator.controller.report_server import BoundPod, ReportServer
from dtrain_operator.controller.report_tls import issue
from dtrain_operator.core.observation import PodObservation

NS, JOB = "team-a", "resnet"
UNBOUNDED = ServingLimits(connections=10**9, connections_per_peer=10**9, handshake_seconds=60.0, idle_seconds=3600.0,
                          peer_rate=1e9, peer_burst=1e9)


class Jobs:
    """The operator's view of one job with its rank 0 (the honest reporter)."""

    pod = PodObservation(name=f"{JOB}-0", uid="rank-0", resource_version="1", role=contract.ROLE_WORKER, rank=0,
                         generation=0, phase="Running", owner_uid="job-uid")

    def job_uid(self, namespace: str, name: str) -> str | None:
        return "job-uid"

    def pod_of(self, namespace: str, name: str, pod_uid: str) -> PodObservation | None:
        return self.pod if pod_uid == "rank-0" else None

    async def write_reports(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        return None


class Reviewer:
    async def review(self, token: str) -> BoundPod:
        return BoundPod(NS, f"{JOB}-0", "rank-0")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def serve(port: int, bounded: bool, ca_file: Path) -> None:
    tls = issue(["dtrain-operator.dtrain-system.svc"])
    ca_file.write_text(tls.ca_pem)
    server = ReportServer(tls, port, Jobs(), Reviewer(), host="127.0.0.1", limits=ServingLimits() if bounded else UNBOUNDED)
    await server.start()
    print("serving", flush=True)
    await asyncio.Event().wait()


async def honest_report(port: int, context: ssl.SSLContext) -> tuple[int, float]:
    started = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=context, local_addr=("127.0.2.1", 0)), 30)
        body = json.dumps({"records": [{"event": "progress", "time": "2026-01-01T00:00:00Z", "step": 1}]}).encode()
        writer.write((f"POST {contract.report_path(NS, JOB)} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body)
        status = int((await asyncio.wait_for(reader.readline(), 30)).split()[1])
        writer.close()
    except (OSError, asyncio.TimeoutError, IndexError, ValueError):
        status = 0
    return status, time.monotonic() - started


async def flood(port: int, ca_file: Path, connections: int, pods: int) -> dict[str, Any]:
    context = ssl.create_default_context(cadata=ca_file.read_text())
    context.check_hostname = False
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    failed = 0

    async def one(index: int) -> None:
        nonlocal failed
        try:
            opened.append(await asyncio.wait_for(asyncio.open_connection(
                "127.0.0.1", port, ssl=context, local_addr=(f"127.0.1.{1 + index % pods}", 0)), 30))
        except (OSError, asyncio.TimeoutError):
            failed += 1

    for start in range(0, connections, 100):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 100, connections))))
    await asyncio.sleep(1.0)
    held = sum(not reader.at_eof() for reader, _ in opened)  # the server closed the others
    status, seconds = await honest_report(port, context)
    for _, writer in opened:
        writer.close()
    return {"handshaken": len(opened), "failed": failed, "held": held, "honest_status": status, "honest_seconds": seconds}


def run_case(bounded: bool, connections: int, pods: int, port: int) -> dict[str, Any]:
    ca_file = Path(f"/tmp/dtrain-bench-report-ca-{os.getpid()}-{int(bounded)}.pem")
    server = subprocess.Popen([sys.executable, "-m", "bench.report_flood", "--serve", str(port), "--ca", str(ca_file)]
                              + (["--unbounded"] if not bounded else []), stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "serving"
        before = rss_mib(server.pid)
        outcome = asyncio.run(flood(port, ca_file, connections, pods))
        during = rss_mib(server.pid)
    finally:
        server.kill()
        server.wait()
        ca_file.unlink(missing_ok=True)
    return {"bounded": bounded, "connections": connections, "pods": pods, "rss_before_mib": before,
            "rss_flood_mib": during, **outcome}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.report_flood", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="300 connections from 10 pods: seconds, for the tests")
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--pods", type=int, default=30)
    parser.add_argument("--out", default=None, help="results JSON (default bench/results/report_flood.json)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ca", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--unbounded", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args.serve, not args.unbounded, args.ca))
        return 0
    from tests.ports import free_port

    connections, pods = (300, 10) if args.smoke else (args.connections, args.pods)
    cases = [run_case(bounded, connections, pods, free_port()) for bounded in (False, True)]
    print(markdown_table(
        ["endpoint", "idle connections tried", "held by the server", "server RSS before (MiB)", "at the flood (MiB)",
         "honest report", "its latency (s)"],
        [["bounded" if c["bounded"] else "unbounded", c["connections"], c["held"], c["rss_before_mib"],
          c["rss_flood_mib"], c["honest_status"], c["honest_seconds"]] for c in cases],
    ))
    path = write_results("report_flood", {"machine": machine(), "cases": cases}, args.out)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
