"""Inference: PyTorch eager vs ONNX Runtime on the CPU, and TensorRT fp16 vs PyTorch eager on a GPU.

For ResNet-50 (224x224, 1,000 classes) and the quick-start model (resnet18, 32x32,
10 classes, as examples/quickstart.yaml trains it), at batch 1 and 32: latency median and p99 per call, and throughput.
Models have random weights (nothing is downloaded). The ONNX file is the one dtrain
exports at the end of training (`dtrain_trainer.export`), so the ONNX Runtime and
TensorRT rows time exactly what a job produces. Every runtime's output is compared
with eager's on the same input, so a row that timed a wrong model shows it.

    python -m bench.inference                 # the full table (minutes on 2 cores)
    python -m bench.inference --smoke         # seconds: tiny model, for the tests
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torchvision

from dtrain_trainer import export as dtrain_export
from dtrain_trainer.example_inputs import INPUT_NAME

from .common import machine, markdown_table, percentile, write_results


@dataclass(frozen=True)
class ModelCase:
    label: str
    arch: str
    image_size: int
    num_classes: int


FULL_MODELS: tuple[ModelCase, ...] = (
    ModelCase("ResNet-50", "resnet50", 224, 1000),
    ModelCase("quick-start (resnet18)", "resnet18", 32, 10),
)
SMOKE_MODELS: tuple[ModelCase, ...] = (ModelCase("smoke (resnet18)", "resnet18", 32, 10),)


@dataclass
class Row:
    model: str
    input: str
    batch: int
    runtime: str
    device: str
    latency_median_ms: float = float("nan")
    latency_p99_ms: float = float("nan")
    images_per_second: float = float("nan")
    speedup_vs_eager: float = float("nan")
    max_abs_diff_vs_eager: float = float("nan")
    iterations: int = 0
    note: str = ""


@dataclass(frozen=True)
class Budget:
    warmup: int
    min_iterations: int
    max_iterations: int
    min_seconds: float


def time_interleaved(
    calls: list[Callable[[], Any]], budget: Budget, synchronize: Callable[[], None] = lambda: None
) -> list[list[float]]:
    """Seconds per call of each runtime, taking turns call by call (so that a change in the machine's
    load hits every runtime alike), after warm-up, until both the iteration and the time minimums are met."""
    for call in calls:
        for _ in range(budget.warmup):
            call()
    synchronize()
    latencies: list[list[float]] = [[] for _ in calls]
    started = time.perf_counter()
    while len(latencies[0]) < budget.max_iterations and (
        len(latencies[0]) < budget.min_iterations or time.perf_counter() - started < budget.min_seconds * len(calls)
    ):
        for call, samples in zip(calls, latencies):
            begin = time.perf_counter()
            call()
            synchronize()
            samples.append(time.perf_counter() - begin)
    return latencies


def fill(row: Row, latencies: list[float], eager_median_s: float) -> Row:
    median = percentile(latencies, 50)
    row.latency_median_ms = 1000 * median
    row.latency_p99_ms = 1000 * percentile(latencies, 99)
    row.images_per_second = row.batch * len(latencies) / sum(latencies)
    row.iterations = len(latencies)
    row.speedup_vs_eager = eager_median_s / median
    return row


def build_model(case: ModelCase) -> torch.nn.Module:
    return torchvision.models.get_model(case.arch, weights=None, num_classes=case.num_classes).eval()


def export_onnx(model: torch.nn.Module, case: ModelCase, path: Path) -> Path:
    """The model exported as a dtrain job exports it by default (opset 17, dynamic batch axis)."""
    sample_shape = (3, case.image_size, case.image_size)
    exported = dtrain_export.export_onnx(model, sample_shape, path, opset=17, dynamic_batch=True)
    model.eval()
    return exported.path


def cpu_rows(case: ModelCase, batches: list[int], threads: int, budget: Budget, workdir: Path) -> list[Row]:
    import onnxruntime as ort

    torch.set_num_threads(threads)
    model = build_model(case)
    onnx_path = export_onnx(model, case, workdir / f"{case.arch}-{case.image_size}.onnx")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    rows = []
    for batch in batches:
        shape = f"{batch}x3x{case.image_size}x{case.image_size}"
        inputs = torch.randn(batch, 3, case.image_size, case.image_size)
        feed = {input_name: inputs.numpy()}
        with torch.inference_mode():
            expected = model(inputs).numpy()
            actual = session.run(None, feed)[0]
            eager_latencies, ort_latencies = time_interleaved(
                [functools.partial(model, inputs), functools.partial(session.run, None, feed)], budget
            )
        eager_median = percentile(eager_latencies, 50)
        device = f"CPU x{threads} threads"
        eager_row = fill(Row(case.label, shape, batch, "PyTorch eager", device), eager_latencies, eager_median)
        eager_row.max_abs_diff_vs_eager = 0.0
        rows.append(eager_row)
        ort_row = fill(Row(case.label, shape, batch, "ONNX Runtime", device), ort_latencies, eager_median)
        ort_row.max_abs_diff_vs_eager = float(np.max(np.abs(actual - expected)))
        rows.append(ort_row)
    return rows


def tensorrt_unavailable_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    try:
        import tensorrt  # noqa: F401
    except ImportError as error:
        return f"TensorRT is not installed ({error})"
    return None


def build_tensorrt_fp16(onnx_path: Path, batches: list[int], workdir: Path) -> Any:
    """An fp16 engine built by dtrain's own builder (what `dtrain build-engine` runs), for batches min..max."""
    from dtrain_engine.build_plan import plan_build
    from dtrain_engine.device import TorchCudaDevice
    from dtrain_engine.onnx_model import convert_to_float16, inspect_onnx
    from dtrain_engine.tensorrt_runtime import TensorRTEngine, TensorRTLog, build_engine, tensorrt_version
    from dtrain_operator.api.engine_options import EngineBuildOptions

    model = inspect_onnx(str(onnx_path))
    options = EngineBuildOptions(precision="fp16", min_batch=min(batches), opt_batch=max(batches), max_batch=max(batches))
    plan = plan_build(model, options, tensorrt_version())
    source = str(onnx_path)
    if plan.onnx_conversion == "float16":
        source = str(workdir / f"{onnx_path.stem}-fp16.onnx")
        convert_to_float16(str(onnx_path), source)
    log = TensorRTLog()
    built = build_engine(source, plan, log)
    return TensorRTEngine(built.plan, plan, TorchCudaDevice(), log, source)


def gpu_rows(case: ModelCase, batches: list[int], budget: Budget, workdir: Path) -> list[Row]:
    """TensorRT fp16 against PyTorch eager (fp32 and fp16) on the first CUDA device, inputs already on the GPU."""
    reason = tensorrt_unavailable_reason()
    if reason is not None:
        return [
            Row(case.label, f"{b}x3x{case.image_size}x{case.image_size}", b, "TensorRT fp16", "GPU",
                note=f"not available here: {reason}")
            for b in batches
        ]
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    model = build_model(case)
    onnx_path = export_onnx(model, case, workdir / f"{case.arch}-{case.image_size}-gpu.onnx")
    engine = build_tensorrt_fp16(onnx_path, batches, workdir)
    model = model.to(device)
    half_model = build_model(case)
    half_model.load_state_dict(model.state_dict())
    half_model = half_model.to(device).half()
    rows = []
    for batch in batches:
        shape = f"{batch}x3x{case.image_size}x{case.image_size}"
        host_inputs = torch.randn(batch, 3, case.image_size, case.image_size)
        inputs = host_inputs.to(device)
        half_inputs = inputs.half()
        feed = {INPUT_NAME: host_inputs.numpy()}
        [actual] = engine.infer(feed).values()
        run_engine = engine.prepare_timed_run(feed)
        with torch.inference_mode():
            expected = model(inputs).float().cpu().numpy()
            eager32, eager16, tensorrt = time_interleaved(
                [functools.partial(model, inputs), functools.partial(half_model, half_inputs), run_engine], budget,
                torch.cuda.synchronize,
            )
        eager_median = percentile(eager32, 50)
        eager32_row = fill(Row(case.label, shape, batch, "PyTorch eager fp32", name), eager32, eager_median)
        eager32_row.max_abs_diff_vs_eager = 0.0
        eager16_row = fill(Row(case.label, shape, batch, "PyTorch eager fp16", name), eager16, eager_median)
        trt_row = fill(Row(case.label, shape, batch, "TensorRT fp16", name), tensorrt, eager_median)
        trt_row.max_abs_diff_vs_eager = float(np.max(np.abs(actual - expected)))
        rows += [eager32_row, eager16_row, trt_row]
    return rows


TABLE_HEADERS = (
    "model", "input", "runtime", "device", "latency median (ms)", "latency p99 (ms)", "images/s",
    "speed-up vs eager", "max abs diff vs eager", "calls",
)


def table(rows: list[Row]) -> str:
    return markdown_table(
        TABLE_HEADERS,
        (
            [r.model, r.input, r.runtime, r.device, r.latency_median_ms, r.latency_p99_ms, r.images_per_second,
             r.speedup_vs_eager, f"{r.max_abs_diff_vs_eager:.1e}" if r.iterations else "n/a",
             r.iterations if r.iterations else r.note]
            for r in rows
        ),
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.inference", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model and a few calls: seconds, for the tests")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,32; smoke 1,2)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads for both runtimes")
    parser.add_argument("--min-seconds", type=float, default=None, help="time each row at least this long")
    parser.add_argument("--out", help="results JSON (default bench/results/inference.json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.smoke:
        models, default_batches = SMOKE_MODELS, "1,2"
        budget = Budget(warmup=1, min_iterations=3, max_iterations=5, min_seconds=0.0)
    else:
        models, default_batches = FULL_MODELS, "1,32"
        budget = Budget(warmup=3, min_iterations=20, max_iterations=2000, min_seconds=15.0)
    if args.min_seconds is not None:
        budget = Budget(budget.warmup, budget.min_iterations, budget.max_iterations, args.min_seconds)
    batches = [int(b) for b in (args.batches or default_batches).split(",")]
    where = machine()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-inference-") as tmp:
        for case in models:
            rows += cpu_rows(case, batches, args.threads, budget, Path(tmp))
            rows += gpu_rows(case, batches, budget, Path(tmp))
    print(table(rows))
    path = write_results(
        "inference",
        {
            "machine": where,
            "versions": versions(),
            "threads": args.threads,
            "budget": asdict(budget),
            "rows": [asdict(r) for r in rows],
        },
        args.out,
    )
    print(f"\nresults: {path}")
    return 0


def versions() -> dict[str, str]:
    import onnxruntime

    return {"torch": torch.__version__, "torchvision": torchvision.__version__, "onnxruntime": onnxruntime.__version__}


if __name__ == "__main__":
    sys.exit(main())
