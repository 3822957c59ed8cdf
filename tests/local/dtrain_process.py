"""Run `dtrain run` as a user does (a separate process, output not a terminal) and watch what it starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import yaml

from dtrain_operator.api import contract

USER_MODELS_DIR = Path(__file__).parent


def tiny_job(name: str, **spec: Any) -> dict[str, Any]:
    """A quickstart-like job, smaller still: 2 CPU nodes, a small torchvision model, 32x32 synthetic images."""
    base: dict[str, Any] = {
        "nodes": 2,
        "devicesPerNode": 1,
        "accelerator": "cpu",
        "model": {
            "classPath": "dtrain_trainer.models.ImageClassifier",
            "initArgs": {"arch": "mobilenet_v3_small", "num_classes": 4},
        },
        "data": {
            "classPath": "dtrain_trainer.data.SyntheticImageDataModule",
            "initArgs": {"image_size": 32, "num_classes": 4, "num_samples": 128},
        },
        "trainer": {"maxEpochs": 1, "batchSize": 16, "numWorkers": 0, "logEveryNSteps": 2, "precision": "32-true"},
        "checkpoint": {"everyNSteps": 2, "keepLast": 1},
        "engine": {"precision": "fp32", "minBatch": 1, "optBatch": 2, "maxBatch": 4},
        "runPolicy": {"backoffLimit": 1},
    }
    return {
        "apiVersion": "dtrain.dev/v1alpha1",
        "kind": "DistributedTraining",
        "metadata": {"name": name},
        "spec": merged(base, spec),
    }


# The progress deadline of the tests that hang a rank or watch the deadline hold: the shortest a job may set
# (twice a pod's report interval). On a loaded machine (CI builds beside the tests) a tiny job's first steps can be
# 10 s apart, and rank 0, which reports every 2 s under `dtrain run` and so collects every rank's stacks 23 s into a
# stall, is left 7 s to do it.
HANG_DEADLINE = contract.MIN_PROGRESS_DEADLINE_SECONDS


def hang_job(name: str, **spec: Any) -> dict[str, Any]:
    """A tiny job with the progress deadline on, one restart allowed, and no export or engine to wait for."""
    return tiny_job(
        name,
        runPolicy={"backoffLimit": 1, "progressDeadlineSeconds": HANG_DEADLINE},
        export={"onnx": {"enabled": False}},
        engine={"enabled": False},
        **spec,
    )


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` merged in, mapping by mapping."""
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def write_job(directory: Path, job: dict[str, Any]) -> Path:
    path = directory / f"{job['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


class DtrainRun:
    """`python -m dtrain_operator.cli run ...` with its output collected and its process tree watched."""

    def __init__(self, cwd: Path, *args: str) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(USER_MODELS_DIR), env.get("PYTHONPATH")]))
        # The test machine's cores are shared with other tests: one thread per process, as `make test` sets.
        env["OMP_NUM_THREADS"] = "1"
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "dtrain_operator.cli", "run", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        # Every process the run started, by pid, with its start time.
        self.seen: dict[int, float] = {}
        self._readers = [
            threading.Thread(target=self._read_output, daemon=True),
            threading.Thread(target=self._watch_tree, daemon=True),
        ]
        for thread in self._readers:
            thread.start()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def _read_output(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    def _watch_tree(self) -> None:
        try:
            root = psutil.Process(self.popen.pid)
        except psutil.Error:
            return
        while self.popen.poll() is None:
            try:
                for proc in root.children(recursive=True):
                    self.seen.setdefault(proc.pid, proc.create_time())
            except psutil.Error:
                pass
            time.sleep(0.1)

    def processes(self, predicate: Callable[[psutil.Process], bool]) -> list[psutil.Process]:
        found = []
        for pid, created in list(self.seen.items()):
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE and predicate(proc):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def wait(self, timeout: float) -> int:
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"dtrain run did not finish within {timeout} s; output:\n{self.output}") from None
        for thread in self._readers:
            thread.join(timeout=5)
        return code

    def leftovers(self, settle_seconds: float = 5.0) -> list[str]:
        """Processes the run started that are still alive (given a moment to exit)."""
        deadline = time.monotonic() + settle_seconds
        while True:
            alive = self.processes(lambda proc: True)
            if not alive or time.monotonic() > deadline:
                return [f"{p.pid}: {' '.join(p.cmdline()[:6])}" for p in alive]
            time.sleep(0.2)

    def kill(self) -> None:
        """Test cleanup: end the run and everything it started."""
        for proc in [psutil.Process(self.popen.pid), *self.processes(lambda p: True)]:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        self.popen.wait(timeout=10)


def torchrun_of_node(run: DtrainRun, rank: int) -> psutil.Process | None:
    """The torchrun process that runs node `rank`."""

    def is_node(proc: psutil.Process) -> bool:
        return "dtrain_trainer.launch" in proc.cmdline() and proc.environ().get("PET_NODE_RANK") == str(rank)

    found = run.processes(is_node)
    return found[0] if found else None


def records(workdir: Path) -> list[dict[str, Any]]:
    path = workdir / "progress.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def wait_for_record(
    run: DtrainRun, workdir: Path, predicate: Callable[[dict[str, Any]], bool], timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for record in records(workdir):
            if predicate(record):
                return record
        if run.popen.poll() is not None:
            raise AssertionError(f"dtrain run ended (code {run.popen.returncode}) first; output:\n{run.output}")
        time.sleep(0.1)
    raise AssertionError(f"no such progress record within {timeout} s; output:\n{run.output}")
