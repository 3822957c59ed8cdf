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
and spread are the result. Target: ratio >= 0.97. One run of one side: bench/overhead_run.py.

    python -m bench.trainer_overhead               # the full measurement (minutes)
    python -m bench.trainer_overhead --smoke       # seconds, for the tests
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .common import machine, markdown_table, spread, write_results
from .overhead_run import RunResult, Workload, benchmark_job, run_arm

TARGET_RATIO = 0.97
SMOKE = Workload(image_size=32, num_samples=64, batch_size=4, steps=4, warmup_batches=2)


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
