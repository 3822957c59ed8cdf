"""`python -m tests.cluster` (part of `make e2e`): the scenarios on the real control plane.

Starts the cluster (`python -m localcluster up`: 2 nodes with one nvidia.com/gpu each, a count the
scheduler checks, which the gang scenarios need, and scheduler-plugins' coscheduling scheduler when its
scenario is selected, built the first time; the Kueue scenarios install Kueue in it) unless one runs,
makes the scenarios' shared claim, runs each scenario, prints the figures, and stops the cluster it started. Needs root and network
namespaces, as `make cluster` does.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import yaml

from .kube import eventually, items, kubectl, layout, localcluster, status
from .queue_scenarios import QUEUE_SCENARIOS
from .scenarios import SCENARIOS
from .scenarios.common import CLAIM, NS, e2e_cluster_arguments

# Kueue's last: they install it in the running cluster (localcluster kueue), and its webhooks then see every pod.
ALL_SCENARIOS = [*SCENARIOS, *QUEUE_SCENARIOS]


def what_the_cluster_says() -> None:
    """After a failed scenario: each job's phase, counts and conditions, the namespace's latest Events and the
    operator's warnings, printed where CI shows them (the cluster and its logs are gone after the run)."""
    try:
        for job in items("dtr", NS):
            found = job.get("status") or {}
            print(f"dtr/{job['metadata']['name']}: {found.get('phase')} restarts {found.get('restarts')} "
                  f"in place {found.get('restartsInPlace')} generation {found.get('gangGeneration')} "
                  f"last restart {found.get('lastRestart')}")
            for condition in found.get("conditions") or []:
                print(f"  {condition['type']}={condition['status']} {condition.get('reason')}: "
                      f"{condition.get('message', '')[:300]}")
        events = sorted(items("events", NS), key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        for event in events[-20:]:
            print(f"  event {event.get('lastTimestamp')} {event['involvedObject'].get('name')} {event['reason']}: "
                  f"{event.get('message', '')[:200]}")
        log = kubectl("logs", "-n", "dtrain-system", "deploy/dtrain-operator", "--tail=2000", check=False).stdout
        for line in [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line][-15:]:
            print(f"  operator: {line[:300]}")
    except Exception as exc:  # noqa: BLE001 - a report of a failure must not hide it
        print(f"(what the cluster says could not be read: {exc})")


def run_file(path: str) -> int:
    """`make e2e JOB=FILE`: the file through kubectl apply, as a user applies it (nothing added)."""
    job = yaml.safe_load(Path(path).read_text())
    name, namespace = job["metadata"]["name"], job["metadata"].get("namespace") or NS
    kubectl("apply", "-n", namespace, "-f", path)
    final = eventually(lambda: status(name, namespace).get("phase") in ("Succeeded", "Failed")
                       and status(name, namespace), f"{name} to finish", 3600, every=2)
    print(kubectl("get", "dtr", name, "-n", namespace).stdout)
    print(json.dumps(final, indent=2))
    return 0 if final["phase"] == "Succeeded" else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=[key for key, _, _ in ALL_SCENARIOS])
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    parser.add_argument("--job", metavar="FILE", help="apply this job file as it is, follow it to its end, print its status")
    args = parser.parse_args(argv)
    selected = args.only or [key for key, _, _ in ALL_SCENARIOS]
    started_here = localcluster("status") != 0
    if started_here and localcluster("up", *e2e_cluster_arguments([] if args.job else selected)) != 0:
        print("e2e (cluster): FAILED: the cluster did not start (above)")
        return 1
    if args.job:
        try:
            return run_file(args.job)
        finally:
            if started_here and not args.keep:
                localcluster("down")
    results, figures = [], {}
    begin = time.monotonic()
    try:
        localcluster("volume", CLAIM, "-n", NS)
        for key, title, scenario in ALL_SCENARIOS:
            if args.only and key not in args.only:
                continue
            print(f"\n=== {title}", flush=True)
            start = time.monotonic()
            try:
                scenario(figures)
            except Exception as exc:  # noqa: BLE001 - one scenario's failure is reported and the next one runs
                traceback.print_exc()
                what_the_cluster_says()
                print(f"--- FAILED: {title}: {exc}\n--- logs: {layout.LOGS}", flush=True)
                results.append((title, False, time.monotonic() - start))
            else:
                results.append((title, True, time.monotonic() - start))
                print(f"--- passed: {title} ({time.monotonic() - start:.0f} s)", flush=True)
    finally:
        if started_here and not args.keep:
            localcluster("down")
    print(f"\nfigures on the real control plane (Kubernetes {layout.KUBERNETES_VERSION}):")
    print("| figure | value |\n|---|---|")
    for figure, value in figures.items():
        print(f"| {figure} | {value:.1f} |")
    print(f"\ne2e on the real control plane: {time.monotonic() - begin:.0f} s")
    for title, ok, seconds in results:
        print(f"{'PASSED' if ok else 'FAILED'}  {title}  ({seconds:.0f} s)")
    passed = sum(ok for _, ok, _ in results)
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if results and passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
