"""Hangs, pre-flight and stragglers, measured side by side in one run of `dtrain run` on this machine.

Three tiny CPU jobs of 2 nodes (tests/local's quickstart-like job, mobilenet_v3_small 32x32):

- **hang**: rank 1 sleeps inside training_step at step 3 (once, tests/local/user_models.py's
  HangingClassifier), so rank 0 waits for it in the gradient all-reduce, as behind a cut link.
  Timed from the moment it starts to sleep (the marker file it writes) to dtrain run's restart
  decision and to the restarted gang's first training step; against nccl.timeoutSeconds (1800 s),
  which is how long the gang would otherwise wait.
- **pre-flight**: the `seconds` of every pre-flight record of the three jobs (one per gang start):
  what the check costs each start, with its latency and bus bandwidth.
- **straggler**: rank 1 sleeps `--slow-delay` s in every training_step (SlowClassifier); timed
  from training start (the trainer's start line) to dtrain run's straggler warning, with
  stragglers.everyNSteps 5 and window 3.

`OMP_NUM_THREADS=1 .venv/bin/python -m bench.resilience [--deadline 30]` (`--smoke`: the same three jobs, for the
tests, the figures not meant to be read)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench.common import REPO_ROOT, machine, markdown_table, write_results
from dtrain_operator.api import contract

USER_MODELS = REPO_ROOT / "tests" / "local"
COLLECTIVE_TIMEOUT_SECONDS = 1800


def tiny_job(name: str, **spec: Any) -> dict[str, Any]:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.local.dtrain_process import tiny_job as base

    return base(name, **spec)


class Run:
    """`dtrain run` with every output line stamped by this process's clock."""

    def __init__(self, directory: Path, job: dict[str, Any]) -> None:
        path = directory / f"{job['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(job, sort_keys=False))
        self.workdir = directory / job["metadata"]["name"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(USER_MODELS), env.get("PYTHONPATH")]))
        self.started = time.time()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "dtrain_operator.cli", "run", str(path), "--workdir", str(self.workdir), "--no-engine"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
        )
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait(self, timeout: float) -> int:
        code = self.popen.wait(timeout)
        self._reader.join(5)
        if code != 0:
            raise SystemExit(f"dtrain run failed ({code}):\n" + "\n".join(text for _, text in self.lines))
        return code

    def first(self, needle: str, after: float = 0.0) -> float:
        return next(t for t, text in self.lines if needle in text and t >= after)

    def records(self) -> list[dict[str, Any]]:
        path = self.workdir / "progress.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


NO_EXPORT = {"export": {"onnx": {"enabled": False}}, "engine": {"enabled": False}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deadline", type=int, default=contract.MIN_PROGRESS_DEADLINE_SECONDS,
                        help="runPolicy.progressDeadlineSeconds of the hang job (default: the shortest a job may set, 30)")
    parser.add_argument("--slow-delay", type=float, default=0.3, help="seconds rank 1 sleeps per step (straggler)")
    # Every benchmark takes --smoke (tests/bench); this one is short already at the shortest deadline a job may set.
    parser.add_argument("--smoke", action="store_true", help="the same run, for the tests")
    parser.add_argument("--out", default=None)
    return parser.parse_args(argv)


def run_hang(directory: Path, deadline: int) -> tuple[Run, dict[str, Any]]:
    """The hang job, timed from rank 1's marker file to the restart decision, the new gang and training again."""
    marker = directory / "hung"
    hang = Run(directory, tiny_job(
        "bench-hang",
        model={"classPath": "user_models.HangingClassifier", "initArgs": {"marker": str(marker), "hang_at_step": 3}},
        runPolicy={"backoffLimit": 1, "progressDeadlineSeconds": deadline},
        **NO_EXPORT,
    ))
    hang.wait(900)
    hung_at = marker.stat().st_mtime
    decided = hang.first("ProgressDeadlineExceeded") - hung_at
    restarted = hang.first("gang restarted from the last checkpoint") - hung_at
    records = hang.records()
    resumed_index = next(i for i, r in enumerate(records) if r.get("event") == "resumed")
    training_again = next(r for r in records[resumed_index:] if r.get("event") == "progress")
    back = datetime.fromisoformat(training_again["time"].replace("Z", "+00:00")).timestamp() - hung_at
    return hang, {
        "progress_deadline_seconds": deadline,
        "collective_timeout_seconds": COLLECTIVE_TIMEOUT_SECONDS,
        "restart_decided_seconds": decided,
        "gang_restarted_seconds": restarted,
        "training_again_seconds": back,
    }


def run_straggler(directory: Path, slow_delay: float) -> tuple[Run, dict[str, Any]]:
    """The straggler job, timed from training start to dtrain run's straggler warning."""
    slow = Run(directory, tiny_job(
        "bench-slow",
        model={"classPath": "user_models.SlowClassifier", "initArgs": {"delay": slow_delay, "slow_rank": 1}},
        data={"initArgs": {"num_samples": 1024}},
        stragglers={"everyNSteps": 5, "factor": 1.5, "window": 3},
        **NO_EXPORT,
    ))
    slow.wait(900)
    detected = slow.first("is a straggler") - slow.first("training started")
    straggler_record = next(r for r in slow.records() if (r.get("stepTimes") or {}).get("straggler"))
    return slow, {
        "delay_seconds": slow_delay,
        "every_n_steps": 5,
        "window": 3,
        "detected_seconds_after_training_start": detected,
        "detected_at_step": straggler_record["stepTimes"]["step"],
        "ratio": straggler_record["stepTimes"]["ratio"],
    }


def preflight(runs: list[Run]) -> dict[str, Any]:
    """Every pre-flight record of the runs (one per gang start): what it cost, its latency and bandwidth."""
    checks = [r for run in runs for r in run.records() if r.get("event") == "preflight"]
    return {
        "starts": len(checks),
        "seconds_median": statistics.median(c["seconds"] for c in checks),
        "seconds_max": max(c["seconds"] for c in checks),
        "latency_ms_median": statistics.median(c["latencyMs"] for c in checks),
        "bus_bandwidth_gbps_median": statistics.median(c["busBandwidthGBps"] for c in checks),
    }


def table(results: dict[str, Any]) -> str:
    h, p, s = results["hang"], results["preflight"], results["straggler"]
    return markdown_table(
        ["measure", "dtrain", "without it"],
        [
            ["hang -> restart decided (s)", h["restart_decided_seconds"], f"{COLLECTIVE_TIMEOUT_SECONDS} (nccl.timeoutSeconds)"],
            ["hang -> new gang started (s)", h["gang_restarted_seconds"], ""],
            ["hang -> training again (s)", h["training_again_seconds"], ""],
            ["pre-flight per start (s, median / max)", f"{p['seconds_median']:.3g} / {p['seconds_max']:.3g}", "0"],
            ["pre-flight all-reduce latency (ms) / bus bandwidth (GB/s)",
             f"{p['latency_ms_median']:.3g} / {p['bus_bandwidth_gbps_median']:.3g}", ""],
            ["straggler detected after training start (s)", s["detected_seconds_after_training_start"],
             f"never (step {s['detected_at_step']}, {s['ratio']:.2f} x the median)"],
        ],
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dtrain-resilience-") as folder:
        directory = Path(folder)
        hang, hang_figures = run_hang(directory, args.deadline)
        slow, straggler_figures = run_straggler(directory, args.slow_delay)
        preflight_figures = preflight([hang, slow])
    results = {
        "machine": machine(), "hang": hang_figures, "preflight": preflight_figures, "straggler": straggler_figures,
    }
    print(table(results))
    print(f"wrote {write_results('resilience', results, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
