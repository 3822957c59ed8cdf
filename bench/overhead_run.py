"""One run of one side of bench.trainer_overhead: the benchmark's job made from the quick start and
sized by the workload, the worker pod's launch environment, one torchrun with each rank's peak RSS
polled, and the throughput read from the ranks' batch-end clocks."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil
import yaml

from dtrain_operator.api import BUILTIN_SYNTHETIC_DATA, DistributedTraining, TrainerConfig, contract
from dtrain_operator.api.validation import validate_file
from dtrain_operator.core.launch_env import LaunchSite
from dtrain_operator.core.launch_env import launch_env as worker_launch_env
from tests.ports import free_port

from .common import REPO_ROOT
from .step_clock import ENV_CLOCK_DIR, median_batch_images_per_second, steady_images_per_second

if TYPE_CHECKING:
    from typing_extensions import Self

QUICKSTART = REPO_ROOT / "examples" / "quickstart.yaml"
TIMED_MODEL = "bench.timed_model.TimedImageClassifier"
ARMS = {"raw": "bench.raw_ddp", "dtrain": "dtrain_trainer"}


@dataclass(frozen=True)
class Workload:
    arch: str = "resnet18"
    image_size: int = 64
    num_classes: int = 10
    num_samples: int = 2048
    batch_size: int = 32
    accumulate_grad_batches: int = 2
    gradient_clip_val: float = 1.0
    precision: str = "32-true"
    steps: int = 50
    warmup_batches: int = 10
    accelerator: str = "cpu"
    processes: int = 2
    num_workers: int = 0

    @property
    def batches(self) -> int:
        return self.steps * self.accumulate_grad_batches


@dataclass
class RunResult:
    arm: str
    repetition: int
    images_per_second: float
    wall_seconds: float
    peak_rss_mib_per_rank: dict[str, float]
    timed_batches: int
    median_batch_images_per_second: float
    self_reported_images_per_second: float | None = None
    load_average: list[float] = field(default_factory=list)


def benchmark_job(workload: Workload, workdir: Path) -> DistributedTraining:
    """The quick-start job, as one node of `processes` processes, sized by the workload."""
    result = validate_file(str(QUICKSTART), cluster=False)  # read as dtrain run reads it: its nodes share a disk
    if result.job is None:
        raise SystemExit(f"{QUICKSTART} does not validate: {result.errors}")
    spec = result.job.spec.model_copy(deep=True)
    spec.nodes = 1
    spec.devices_per_node = workload.processes
    spec.accelerator = workload.accelerator  # type: ignore[assignment]
    # The quick start trains on real digits with a cosine rate; the benchmark keeps synthetic images
    # (no data loading in the measure) and the constant rate the raw loop implements.
    spec.model.init_args.update(
        arch=workload.arch, num_classes=workload.num_classes, optimizer="adam", lr=0.001, lr_schedule="constant"
    )
    # The raw loop reads these too, so none is left to a default that only one side knows.
    spec.data.class_path = BUILTIN_SYNTHETIC_DATA
    spec.data.init_args = {
        "image_size": workload.image_size,
        "num_classes": workload.num_classes,
        "num_samples": workload.num_samples,
        "pool_size": 64,
        "seed": 0,
    }
    trainer = spec.trainer
    # maxSteps alone ends both runs (no epoch limit).
    trainer.max_epochs = None
    trainer.max_steps = workload.steps
    trainer.batch_size = workload.batch_size
    trainer.precision = workload.precision  # type: ignore[assignment]
    trainer.gradient_clip_val = workload.gradient_clip_val or None
    trainer.accumulate_grad_batches = workload.accumulate_grad_batches
    trainer.num_workers = workload.num_workers
    # One checkpoint at the end on both sides; no ONNX export (the raw loop has none).
    spec.checkpoint.dir = str(workdir / "checkpoints")
    spec.checkpoint.every_n_steps = workload.steps + 1_000_000
    spec.artifacts.dir = str(workdir / "artifacts")
    spec.export.onnx.enabled = False
    spec.engine.enabled = False
    return DistributedTraining(metadata=result.job.metadata.model_copy(update={"name": "bench"}), spec=spec)


def launch_env(job: DistributedTraining, config_path: Path, clock_dir: Path, progress_path: Path) -> dict[str, str]:
    """The worker pod's launch environment from the operator's renderer, for a local torchrun."""
    site = LaunchSite(
        master_addr="127.0.0.1",
        master_port=free_port(),
        config_path=str(config_path),
        progress_sink=f"{contract.PROGRESS_SINK_JSONL_PREFIX}{progress_path}",
    )
    env = {**os.environ, **worker_launch_env(job, 0, site)}
    env.update(
        {
            ENV_CLOCK_DIR: str(clock_dir),
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])),
        }
    )
    return env


class PeakRss:
    """Polls the peak resident set (VmHWM, which only grows) of each process torchrun starts."""

    def __init__(self, launcher: psutil.Process, interval: float = 0.2) -> None:
        self.launcher = launcher
        self.interval = interval
        self.peak_mib: dict[int, float] = {}
        self.rank_of: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                children = self.launcher.children()
            except psutil.Error:
                return
            for child in children:
                peak = read_peak_rss_mib(child.pid)
                if peak is None:
                    continue
                self.peak_mib[child.pid] = max(peak, self.peak_mib.get(child.pid, 0.0))
                if child.pid not in self.rank_of:
                    try:
                        rank = child.environ().get("RANK")
                    except psutil.Error:
                        rank = None
                    if rank is not None:  # a child seen between fork and exec has no RANK yet: look again
                        self.rank_of[child.pid] = rank
            self._stop.wait(self.interval)

    def by_rank(self) -> dict[str, float]:
        return {f"rank {self.rank_of.get(pid, pid)}": round(mib, 1) for pid, mib in sorted(self.peak_mib.items())}


def read_peak_rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_arm(arm: str, job: DistributedTraining, workload: Workload, workdir: Path, repetition: int) -> RunResult:
    run_dir = workdir / f"{arm}-{repetition}"
    clock_dir = run_dir / "clock"
    clock_dir.mkdir(parents=True)
    config = TrainerConfig.from_job(job)
    if arm == "dtrain":
        config.model = config.model.model_copy(update={"class_path": TIMED_MODEL})
    config_path = run_dir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config.to_wire(), sort_keys=False))
    progress_path = run_dir / "progress.jsonl"
    env = launch_env(job, config_path, clock_dir, progress_path)
    command = [sys.executable, "-m", "torch.distributed.run", "-m", ARMS[arm]]
    log_path = run_dir / "log.txt"
    started = time.perf_counter()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        with PeakRss(psutil.Process(process.pid)) as rss:
            code = process.wait()
    wall = time.perf_counter() - started
    if code != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-30:])
        raise SystemExit(f"{arm} run {repetition} failed with exit code {code}; the end of {log_path}:\n{tail}")
    rates, median_rates = [], []
    timed_batches = 0
    for clock_file in sorted(clock_dir.glob("rank-*.json")):
        clock = json.loads(clock_file.read_text())
        if len(clock["batch_end_times"]) != workload.batches:
            raise SystemExit(
                f"{arm} run {repetition}: {clock_file.name} timed {len(clock['batch_end_times'])} batches, "
                f"expected {workload.batches}: the two sides did not do the same work"
            )
        # The last batch is left out: dtrain may write its final checkpoint before the hook runs.
        times = clock["batch_end_times"][:-1]
        images_per_batch = clock["batch_size"] * clock["world_size"]
        rates.append(steady_images_per_second(times, workload.warmup_batches, images_per_batch))
        median_rates.append(median_batch_images_per_second(times, workload.warmup_batches, images_per_batch))
        timed_batches = len(times) - workload.warmup_batches
    if len(rates) != workload.processes:
        raise SystemExit(f"{arm} run {repetition}: expected {workload.processes} clock files in {clock_dir}")
    return RunResult(
        arm=arm,
        repetition=repetition,
        images_per_second=statistics.mean(rates),
        wall_seconds=wall,
        peak_rss_mib_per_rank=rss.by_rank(),
        timed_batches=timed_batches,
        median_batch_images_per_second=statistics.mean(median_rates),
        self_reported_images_per_second=self_reported_rate(progress_path) if arm == "dtrain" else None,
        load_average=[round(x, 2) for x in os.getloadavg()],
    )


def self_reported_rate(progress_path: Path) -> float | None:
    """The last imagesPerSecond that dtrain's own progress sink wrote (rank 0's meter), for comparison."""
    if not progress_path.exists():
        return None
    rate = None
    for line in progress_path.read_text().splitlines():
        reported = json.loads(line).get("imagesPerSecond")
        if reported is not None:
            rate = float(reported)
    return rate
