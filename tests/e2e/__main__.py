"""`python -m tests.e2e` (`make e2e`): the scenarios, then the figures table.
`python -m tests.e2e --job FILE` (`make e2e JOB=FILE`): one job file through the whole path.

Needs root and working network namespaces; where they do not work it fails, saying why.
The harness re-runs itself inside the node network namespace it creates, and removes every
namespace it made when it ends (also those a killed earlier run left).
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml

from . import network
from .bench import RELEASE_NAMESPACE, Bench
from .scenarios import SCENARIOS, Figures, figures_table, with_shared_storage

INSIDE = "DTRAIN_E2E_IN_NODE"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e", description=__doc__.splitlines()[0])
    parser.add_argument("--job", metavar="FILE", help="run this job file through the operator and the kubelet")
    parser.add_argument("--only", action="append", metavar="ID", choices=[key for key, _, _ in SCENARIOS],
                        help="run only this scenario (repeat for several)")
    parser.add_argument("--keep", metavar="DIR",
                        help="put the bench's files (pod logs, storage) in DIR and keep them (default: a temporary "
                        "folder, removed when everything passed)")
    return parser.parse_args(argv)


# One run at a time on a machine: the node namespace, the bridge and the API port are fixed, and a
# run removes what an earlier one left.
LOCK_FILE = Path("/run/lock/dtrain-e2e.lock")


def outside(argv: list[str]) -> int:
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    lock = LOCK_FILE.open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"e2e: FAILED: another e2e run holds {LOCK_FILE} (it owns the network namespaces); "
              "wait for it to end", file=sys.stderr)
        return 1
    try:
        network.probe()
        network.setup_node()
    except network.NetworkError as exc:
        print(f"e2e: FAILED: {exc}", file=sys.stderr)
        return 1
    try:
        env = {**os.environ, INSIDE: "1"}
        command = ["ip", "netns", "exec", network.NODE_NETNS, sys.executable, "-m", "tests.e2e", *argv]
        return subprocess.run(command, env=env, check=False).returncode
    finally:
        network.cleanup_leftovers()


def invalid(path: Path) -> list[str]:
    """What `dtrain validate` says is wrong with the file (the API server here checks no schema)."""
    from dtrain_operator.api.validation import load_job

    _, errors = load_job(path)
    return errors


async def run_file(bench: Bench, path: Path) -> int:
    job = with_shared_storage(yaml.safe_load(path.read_text()))
    job["metadata"]["namespace"] = job["metadata"].get("namespace") or RELEASE_NAMESPACE
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    async with bench.watching(namespace, name):
        await bench.cluster.apply(job)
        final = await bench.cluster.eventually(
            lambda: bench.cluster.status(namespace, name).get("phase") in ("Succeeded", "Failed")
            and bench.cluster.status(namespace, name), f"{name} finished", timeout=3600)
    print(json.dumps(final, indent=2))
    print(f"pod logs and the job's storage: {bench.kubelet.folder}", file=sys.stderr)
    return 0 if final.get("phase") == "Succeeded" else 1


async def inside(args: argparse.Namespace) -> int:
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dtrain-e2e-"))
    env_bin = Path(sys.executable).parent
    started = time.monotonic()
    async with Bench(folder, env_bin) as bench:
        await bench.start_operator()
        if args.job:
            return await run_file(bench, Path(args.job))
        figures = Figures()
        results = []
        for key, title, scenario in SCENARIOS:
            if args.only and key not in args.only:
                continue
            print(f"\n=== {title}", flush=True)
            begin = time.monotonic()
            try:
                await scenario(bench, figures)
            except Exception as exc:  # noqa: BLE001 - one scenario's failure is reported and the next scenario runs
                traceback.print_exc()
                results.append((title, False, time.monotonic() - begin))
                print(f"--- FAILED: {title}: {exc}", flush=True)
                print(f"--- operator log ---\n{bench.operator.log_tail(40)}", flush=True)
            else:
                results.append((title, True, time.monotonic() - begin))
                print(f"--- passed: {title} ({time.monotonic() - begin:.0f} s)", flush=True)
        # Every scenario ran with the chart's RBAC: a refused call of the operator or the trainer is a
        # permission the chart lacks (or a call the product should not make).
        refused = [f"{user}: {attributes.describe()}" for user, attributes in bench.authz.denied]
        results.append(("RBAC: no call of the operator or the trainer refused", not refused, 0.0))
        if refused:
            print("--- FAILED: refused by the chart's RBAC:\n" + "\n".join(sorted(set(refused))), flush=True)
    print("\nfigures (this run; the README's Performance section has a run of the whole e2e):")
    print(figures_table(figures))
    passed = sum(ok for _, ok, _ in results)
    everything = bool(results) and passed == len(results)
    if everything and not args.keep:
        shutil.rmtree(folder, ignore_errors=True)  # checkpoints and logs: kept only when asked, or on failure
        kept = ""
    else:
        kept = f"; pod logs, storage and the operator's log: {folder}"
    print(f"\ne2e wall time: {time.monotonic() - started:.0f} s{kept}")
    for title, ok, seconds in results:
        print(f"{'PASSED' if ok else 'FAILED'}  {title}  ({seconds:.0f} s)")
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if everything else 1


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.job and (errors := invalid(Path(args.job))):
        print("\n".join(errors), file=sys.stderr)
        return 2
    if os.environ.get(INSIDE) != "1" or network.current_netns() != network.NODE_NETNS:
        return outside(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    return asyncio.run(inside(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
