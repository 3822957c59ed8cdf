"""Trainer overhead: dtrain's trainer against a plain PyTorch DDP loop, same work, under torchrun.

Both sides read the same trainer config, made from examples/quickstart.yaml (resnet18,
batch 32 per process, Adam, gradient clipping 1.0) with its digits replaced by 64x64
synthetic images, a constant learning rate and gradient accumulation 2 added, and run it as one torchrun with 2 processes (gloo on
the CPU, or one process per GPU with --accelerator gpu). The launch environment is
the one the operator renders for a worker pod (`core.launch_env`), at a site on this
machine (rank 0 at 127.0.0.1). Runs alternate raw, dtrain, raw, dtrain, ... so that
a change in the machine's load hits both alike.

Reported per run: steady-state images/s (from batch-end timestamps taken the same way
on both sides, warm-up batches and the last batch left out), end-to-end wall time of
torchrun (process start-up, rendezvous, training, final checkpoint) and peak RSS of
each rank. The ratio dtrain/raw is taken per pair of neighbouring runs; its median
and spread are the result. Target: ratio >= 0.97.

    python -m bench.trainer_overhead               # the full measurement (minutes)
    python -m bench.trainer_overhead --smoke       # seconds, for the tests
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import yaml

from dtrain_operator.api import BUILTIN_SYNTHETIC_DATA, DistributedTraining, TrainerConfig, contract
from dtrain_operator.api.validation import validate_file
from dtrain_operator.core.launch_env import LaunchSite
from dtrain_operator.core.launch_env import launch_env as worker_launch_env
from tests.ports import free_port

from .common import REPO_ROOT, machine, markdown_table, spread, write_results
from .step_clock import ENV_CLOCK_DIR, median_batch_images_per_second, steady_images_per_second

if TYPE_CHECKING:
    from typing_extensions import Self

QUICKSTART = REPO_ROOT / "examples" / "quickstart.yaml"
TIMED_MODEL = "bench.timed_model.TimedImageClassifier"
ARMS = {"raw": "bench.raw_ddp", "dtrain": "dtrain_trainer"}
TARGET_RATIO = 0.97


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


SMOKE = Workload(image_size=32, num_samples=64, batch_size=4, steps=4, warmup_batches=2)


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


def summarize(runs: list[RunResult], repetitions: int) -> dict[str, Any]:
    def of(arm: str) -> list[RunResult]:
        return [r for r in runs if r.arm == arm]

    raw, dtrain = of("raw"), of("dtrain")
    ratios = [d.images_per_second / r.images_per_second for r, d in zip(raw, dtrain)]
    median_batch_ratios = [
        d.median_batch_images_per_second / r.median_batch_images_per_second for r, d in zip(raw, dtrain)
    ]
    wall_ratios = [r.wall_seconds / d.wall_seconds for r, d in zip(raw, dtrain)]
    summary: dict[str, Any] = {"repetitions": repetitions}
    for arm, arm_runs in (("raw", raw), ("dtrain", dtrain)):
        summary[arm] = {
            "images_per_second": spread([r.images_per_second for r in arm_runs]),
            "median_batch_images_per_second": spread([r.median_batch_images_per_second for r in arm_runs]),
            "wall_seconds": spread([r.wall_seconds for r in arm_runs]),
            "peak_rss_mib_max_rank": spread([max(r.peak_rss_mib_per_rank.values(), default=0.0) for r in arm_runs]),
        }
    summary["ratio_dtrain_over_raw"] = spread(ratios)
    summary["median_batch_ratio_dtrain_over_raw"] = spread(median_batch_ratios)
    summary["end_to_end_speed_ratio_dtrain_over_raw"] = spread(wall_ratios)
    summary["target_ratio"] = TARGET_RATIO
    summary["meets_target"] = summary["ratio_dtrain_over_raw"]["median"] >= TARGET_RATIO
    return summary


def per_run_table(runs: list[RunResult]) -> str:
    """One row a run and side: its throughput, wall time, memory and the machine's load."""
    return markdown_table(
        ["run", "side", "images/s (steady)", "images/s (median batch)", "dtrain's own report (images/s)",
         "wall s (end to end)", "peak RSS per rank (MiB)", "load avg (1 min)"],
        (
            [
                f"{r.repetition}",
                r.arm,
                r.images_per_second,
                r.median_batch_images_per_second,
                r.self_reported_images_per_second if r.self_reported_images_per_second is not None else "",
                r.wall_seconds,
                ", ".join(f"{v:.0f}" for v in r.peak_rss_mib_per_rank.values()),
                r.load_average[0] if r.load_average else float("nan"),
            ]
            for r in runs
        ),
    )


def result_table(summary: dict[str, Any]) -> str:
    """The two sides' medians and their ratio, against the target."""
    raw, dtrain = summary["raw"], summary["dtrain"]
    ratio, wall_ratio = summary["ratio_dtrain_over_raw"], summary["end_to_end_speed_ratio_dtrain_over_raw"]
    mb = summary["median_batch_ratio_dtrain_over_raw"]
    return markdown_table(
        ["measure", "raw PyTorch DDP", "dtrain", "dtrain / raw (median, min-max)", "target"],
        [
            [
                "steady-state images/s",
                raw["images_per_second"]["median"],
                dtrain["images_per_second"]["median"],
                f"{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})",
                f">= {TARGET_RATIO}",
            ],
            [
                "images/s of the median batch (robust to load spikes)",
                raw["median_batch_images_per_second"]["median"],
                dtrain["median_batch_images_per_second"]["median"],
                f"{mb['median']:.3f} ({mb['min']:.3f}-{mb['max']:.3f})",
                "",
            ],
            [
                "end-to-end wall s (start-up included)",
                raw["wall_seconds"]["median"],
                dtrain["wall_seconds"]["median"],
                f"speed {wall_ratio['median']:.3f} ({wall_ratio['min']:.3f}-{wall_ratio['max']:.3f})",
                "",
            ],
            [
                "peak RSS, largest rank (MiB)",
                raw["peak_rss_mib_max_rank"]["median"],
                dtrain["peak_rss_mib_max_rank"]["median"],
                f"{dtrain['peak_rss_mib_max_rank']['median'] / raw['peak_rss_mib_max_rank']['median']:.2f}x",
                "",
            ],
        ],
    )


def workload_header(workload: Workload, repetitions: int) -> str:
    """The workload in one line: model, batch, processes, precision, steps, repetitions."""
    return (
        f"{workload.arch} {workload.image_size}x{workload.image_size}, batch {workload.batch_size}/process, "
        f"{workload.processes} processes ({workload.accelerator}), {workload.precision}, "
        f"accumulate {workload.accumulate_grad_batches}, clip {workload.gradient_clip_val}, "
        f"{workload.steps} optimizer steps ({workload.batches} batches, first {workload.warmup_batches} "
        f"and the last not timed), {repetitions} repetitions"
    )


def tables(workload: Workload, runs: list[RunResult], summary: dict[str, Any]) -> str:
    header, result, per_run = workload_header(workload, summary["repetitions"]), result_table(summary), per_run_table(runs)
    return f"{header}\n\n{result}\n\nPer run:\n\n{per_run}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repetition: seconds, for the tests")
    parser.add_argument("--repetitions", type=int, help="pairs of runs (default 5; smoke 1)")
    parser.add_argument("--steps", type=int, help="optimizer steps per run (default 50)")
    parser.add_argument("--warmup-batches", type=int, help="batches left out of the steady-state rate (default 10)")
    parser.add_argument("--arch", help="torchvision architecture (default resnet18)")
    parser.add_argument("--image-size", type=int, help="image side in pixels (default 64)")
    parser.add_argument("--batch-size", type=int, help="batch per process (default 32)")
    parser.add_argument("--num-classes", type=int, help="classes of the synthetic data and the model (default 10)")
    parser.add_argument("--num-samples", type=int, help="synthetic samples per epoch over all processes (default 2048)")
    parser.add_argument("--accumulate-grad-batches", type=int, help="batches per optimizer step (default 2)")
    parser.add_argument("--gradient-clip-val", type=float, help="gradient norm clipping (default 1.0; 0: none)")
    parser.add_argument("--precision", help="32-true (default), bf16-mixed, 16-mixed (GPU)")
    parser.add_argument("--accelerator", choices=["cpu", "gpu"], help="cpu (gloo, default) or gpu (NCCL)")
    parser.add_argument("--processes", type=int, help="processes (GPUs with --accelerator gpu); default 2")
    parser.add_argument("--num-workers", type=int, help="data-loader workers per process (default 0)")
    parser.add_argument(
        "--workdir", help="keep each run's config, log, clock and checkpoint here (default: a temporary directory)"
    )
    parser.add_argument("--out", help="results JSON (default bench/results/trainer_overhead.json)")
    return parser.parse_args(argv)


def workload_from(args: argparse.Namespace) -> Workload:
    base = SMOKE if args.smoke else Workload()
    overrides = {
        name: getattr(args, name)
        for name in (
            "steps", "warmup_batches", "arch", "image_size", "batch_size", "num_classes", "num_samples",
            "accumulate_grad_batches", "gradient_clip_val", "precision", "accelerator", "processes", "num_workers",
        )
        if getattr(args, name) is not None
    }
    return Workload(**{**asdict(base), **overrides})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workload = workload_from(args)
    repetitions = args.repetitions or (1 if args.smoke else 5)
    where = machine()
    runs: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-trainer-") as tmp:
        workdir = Path(args.workdir or tmp)
        for repetition in range(1, repetitions + 1):
            for arm in ("raw", "dtrain"):
                job = benchmark_job(workload, workdir / f"{arm}-{repetition}")
                run = run_arm(arm, job, workload, workdir, repetition)
                print(
                    f"run {repetition} {arm}: {run.images_per_second:.1f} images/s, {run.wall_seconds:.1f} s",
                    file=sys.stderr,
                )
                runs.append(run)
    summary = summarize(runs, repetitions)
    print(tables(workload, runs, summary))
    results: dict[str, Any] = {"machine": where, "workload": asdict(workload)}
    if workload.accelerator == "gpu":
        import torch

        results["gpu"] = torch.cuda.get_device_name(0)
    results.update(summary=summary, runs=[asdict(r) for r in runs])
    path = write_results("trainer_overhead", results, args.out)
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
