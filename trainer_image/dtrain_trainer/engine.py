"""`dtrain build-engine`: ONNX -> TensorRT engine, checked against references and timed.

With TensorRT and a CUDA GPU it builds the engine (engine_tensorrt), runs it on fresh random
batches at the min, opt and max batch sizes, compares it with ONNX Runtime on the CPU and
with the PyTorch model when one is known, times it next to PyTorch eager, and writes the
engine only when the check passes. Without them it stops with a message naming what is
missing, or, with `--fallback onnxruntime`, checks and times the ONNX model with ONNX
Runtime on the CPU and says plainly that no engine was built.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import secrets
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Optional

import numpy as np

from dtrain_operator import contract

from .engine_check import (
    Backend,
    OnnxRuntimeCpu,
    TimingSettings,
    compare_outputs,
    measure_latency,
    non_finite_outputs,
    random_batch,
)
from .engine_model import (
    ENGINE_SUFFIXES,
    EXIT_CHECK_FAILED,
    EXIT_UNAVAILABLE,
    SUPPORTED_TENSORRT_MAJORS,
    EngineError,
    OnnxModelInfo,
    accuracy_bound,
    check_batch_flags,
    inspect_onnx,
    require_quantized_for_int8,
    resolve_batch_sizes,
    usage_error,
)
from .engine_pytorch import PyTorchEager, SourceLookup, find_pytorch_source, load_pytorch_model
from .engine_report import (
    NO_ENGINE_MESSAGE,
    EngineRun,
    build_report,
    cpu_description,
    format_table,
    termination_log_path,
    termination_summary,
    write_atomic,
)

FALLBACK_ONNXRUNTIME = "onnxruntime"


# --- Arguments ----------------------------------------------------------------------------


def check_arguments(args: argparse.Namespace) -> None:
    """Checks that need neither the model nor a library: one clear line each."""
    check_batch_flags(args.min_batch, args.opt_batch, args.max_batch)
    if args.workspace_mib < 1:
        raise usage_error(f"--workspace-mib {args.workspace_mib}: the builder workspace must be at least 1 MiB")
    if args.warmup < 0:
        raise usage_error(f"--warmup {args.warmup}: use 0 or more warm-up runs")
    if args.iterations < 1:
        raise usage_error(f"--iterations {args.iterations}: time at least 1 run")
    if not args.max_seconds > 0:
        raise usage_error(f"--max-seconds {args.max_seconds}: the time budget must be positive")
    if os.path.isdir(args.out):
        raise usage_error(
            f"--out {args.out} is a directory: give the engine's file name, "
            f"e.g. {os.path.join(args.out, contract.ENGINE_FILE_NAME)}"
        )
    if os.path.abspath(args.out) == os.path.abspath(args.onnx):
        raise usage_error(f"--out {args.out} is the ONNX model itself: write the engine to another file")
    report = report_path(args)
    if report.endswith(ENGINE_SUFFIXES):
        raise usage_error(f"--report {report} is named like an engine ({'/'.join(ENGINE_SUFFIXES)}): name it .json")
    if args.timing_cache is not None and os.path.isdir(args.timing_cache):
        raise usage_error(f"--timing-cache {args.timing_cache} is a directory: give a file name, e.g. timing.cache")


def report_path(args: argparse.Namespace) -> str:
    """--report, or the report file next to the engine."""
    if args.report:
        return str(args.report)
    return os.path.join(os.path.dirname(os.path.abspath(args.out)), contract.ENGINE_REPORT_FILE_NAME)


# --- What this machine has -----------------------------------------------------------------


def probe_tensorrt() -> tuple[Optional[str], Optional[str]]:
    """(TensorRT's version, None) when it can build here, else (None, what is wrong)."""
    try:
        import tensorrt as trt
    except ImportError as error:
        return None, f"TensorRT is not installed (import tensorrt: {error})"
    except Exception as error:  # e.g. an OSError from a missing libnvinfer
        return None, f"TensorRT does not load ({type(error).__name__}: {str(error).strip().splitlines()[0]})"
    version = getattr(trt, "__version__", None)
    if not isinstance(version, str) or not hasattr(trt, "Builder"):
        # tensorrt-stubs alone makes `import tensorrt` succeed as an empty namespace package.
        return None, "TensorRT is not installed (the `tensorrt` module here holds only type stubs)"
    major = int(version.split(".")[0])
    if major not in SUPPORTED_TENSORRT_MAJORS:
        return None, f"TensorRT {version} is installed, but dtrain builds with TensorRT 10 or 11"
    return version, None


def probe_cuda() -> Optional[str]:
    """None when a CUDA GPU is usable, else why not."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (the engine check takes GPU memory and streams from it)"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    return None


def unavailable_error(reasons: list[str]) -> EngineError:
    return EngineError(
        f"cannot build a TensorRT engine here: {'; and '.join(reasons)}. Run it in the engine image "
        f"({contract.DEFAULT_ENGINE_IMAGE}) on a GPU node, or pass --fallback onnxruntime to check and time "
        "the ONNX model with ONNX Runtime on the CPU instead (no engine is built then)",
        EXIT_UNAVAILABLE,
    )


# --- Shared steps ---------------------------------------------------------------------------


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _versions(tensorrt_version: Optional[str]) -> dict[str, str]:
    versions = {}
    for package in ("dtrain", "onnx", "onnxruntime", "numpy", "torch"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    if tensorrt_version:
        versions["tensorrt"] = tensorrt_version
    return versions


@dataclass
class PyTorchModel:
    """The loaded PyTorch model, or why there is none."""

    model: Any
    info: dict[str, Any]


def _load_pytorch(lookup: Optional[SourceLookup]) -> PyTorchModel:
    if lookup is None:
        return PyTorchModel(None, {"available": False, "reason": "--no-baseline"})
    if lookup.source is None:
        return PyTorchModel(None, {"available": False, "reason": lookup.reason})
    try:
        model = load_pytorch_model(lookup.source)
    except EngineError as error:
        if lookup.explicit:
            raise
        print(f"dtrain build-engine: warning: no PyTorch baseline: {error}", file=sys.stderr)
        return PyTorchModel(None, {"available": False, "reason": str(error)})
    return PyTorchModel(model, {"available": True, **lookup.source.to_json()})


def _check_and_time(
    run: EngineRun,
    model: OnnxModelInfo,
    under_test: Backend,
    references: list[Backend],
    baseline: Optional[Backend],
) -> None:
    """Fresh random batches at each batch size: compare with every reference, then time."""
    rng = np.random.default_rng(run.seed)
    run.references = [reference.name for reference in references]
    for batch_size in run.batches.distinct():
        batch = random_batch(model, batch_size, rng)
        outputs = under_test.infer(batch)
        run.non_finite.extend(f"{name} (batch {batch_size})" for name in non_finite_outputs(outputs))
        for reference in references:
            expected = reference.infer(batch)
            run.comparisons.append(compare_outputs(outputs, expected, reference.name, batch_size, run.bound))
        run.latency.append(measure_latency(under_test.prepare_timed_run(batch), batch_size, run.timing))
        if baseline is not None:
            run.pytorch_latency.append(measure_latency(baseline.prepare_timed_run(batch), batch_size, run.timing))


def _accuracy_failure(run: EngineRun) -> str:
    if run.non_finite:
        return f"the outputs hold inf/nan: {', '.join(run.non_finite)}"
    failed = [c for c in run.comparisons if not c.passed]
    worst = failed[0]
    if worst.problem:
        return f"against {worst.reference} at batch {worst.batch_size}: {worst.problem}"
    return (
        f"max relative error {worst.max_relative_error:.3g} against {worst.reference} at batch {worst.batch_size} "
        f"is above the {run.executed_precision} bound {run.bound:g}"
    )


# --- The two paths ---------------------------------------------------------------------------


def _run_tensorrt(
    args: argparse.Namespace, model: OnnxModelInfo, run: EngineRun, pytorch: PyTorchModel, tensorrt_version: str
) -> Optional[bytes]:
    """Build, check and time the engine; the serialized engine when it passed, else None."""
    import tempfile

    import torch

    from . import engine_tensorrt
    from .engine_model import convert_to_float16, plan_precision

    plan = plan_precision(engine_tensorrt.tensorrt_major(), args.precision, model)
    if args.precision == "bf16" and torch.cuda.get_device_capability() < (8, 0):
        raise usage_error(f"--precision bf16 needs a GPU with compute capability 8.0 or newer; this is {run.device}")
    with tempfile.TemporaryDirectory(prefix="dtrain-engine-") as scratch:
        parse_path = model.path
        if plan.onnx_conversion == "float16":
            parse_path = os.path.join(scratch, "model-fp16.onnx")
            convert_to_float16(model.path, parse_path)
        built = engine_tensorrt.build_engine(
            parse_path, model, run.batches, plan, args.workspace_mib, args.timing_cache
        )
    run.tensorrt = {
        "version": tensorrt_version,
        "strongly_typed": plan.strongly_typed,
        "builder_flags": list(plan.builder_flags),
        "onnx_conversion": plan.onnx_conversion,
        "precision_note": plan.note,
        "workspace_mib": args.workspace_mib,
        "timing_cache": built.timing_cache,
        "build_seconds": round(built.seconds, 2),
    }
    engine = engine_tensorrt.TensorRTEngine(built.plan)
    references: list[Backend] = [OnnxRuntimeCpu(model.path)]
    baseline: Optional[PyTorchEager] = None
    if pytorch.model is not None:
        references.append(PyTorchEager(pytorch.model, model, "cpu"))
        autocast = {"fp16": "float16", "bf16": "bfloat16"}.get(args.precision)
        baseline = PyTorchEager(copy.deepcopy(pytorch.model), model, "cuda", autocast)
        pytorch.info["mode"] = baseline.mode
    _check_and_time(run, model, engine, references, baseline)
    return built.plan if run.accuracy_passed else None


def _run_onnxruntime(model: OnnxModelInfo, run: EngineRun, pytorch: PyTorchModel, reasons: list[str]) -> None:
    run.notes.append(
        f"{NO_ENGINE_MESSAGE}: {'; and '.join(reasons)}. ONNX Runtime checked and timed the ONNX model "
        "on the CPU instead (--fallback onnxruntime)."
    )
    if run.requested_precision != run.executed_precision:
        run.notes.append(
            f"--precision {run.requested_precision} applies to TensorRT builds; ONNX Runtime ran the model in its "
            f"exported precision ({run.executed_precision}) and is checked against that precision's bound"
        )
    references: list[Backend] = []
    baseline: Optional[Backend] = None
    if pytorch.model is not None:
        eager = PyTorchEager(pytorch.model, model, "cpu")
        references.append(eager)
        baseline = eager
        pytorch.info["mode"] = eager.mode
    else:
        run.notes.append(
            "the outputs were only checked to be finite: with no PyTorch model there is no independent reference "
            "for ONNX Runtime to be compared with"
        )
    _check_and_time(run, model, OnnxRuntimeCpu(model.path), references, baseline)


# --- The command --------------------------------------------------------------------------------


def _build_engine(args: argparse.Namespace) -> int:
    check_arguments(args)
    model = inspect_onnx(args.onnx)
    batches = resolve_batch_sizes(model, args.min_batch, args.opt_batch, args.max_batch)
    require_quantized_for_int8(args.precision, model)
    lookup = None if args.no_baseline else find_pytorch_source(args.onnx, args.pytorch_checkpoint, args.model_config)
    for warning in lookup.warnings if lookup else []:
        print(f"dtrain build-engine: warning: {warning}", file=sys.stderr)

    tensorrt_version, tensorrt_missing = probe_tensorrt()
    cuda_missing = probe_cuda()
    reasons = [reason for reason in (tensorrt_missing, cuda_missing) if reason]
    if reasons and args.fallback != FALLBACK_ONNXRUNTIME:
        raise unavailable_error(reasons)
    use_tensorrt = not reasons

    pytorch = _load_pytorch(lookup)
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    timing = TimingSettings(warmup=args.warmup, iterations=args.iterations, max_seconds=args.max_seconds)
    executed = args.precision if use_tensorrt else model.exported_precision
    if use_tensorrt:
        import torch

        device = torch.cuda.get_device_name()
    else:
        device = cpu_description(os.cpu_count() or 1)
    run = EngineRun(
        backend="tensorrt" if use_tensorrt else OnnxRuntimeCpu.name,
        onnx=model,
        onnx_sha256=_sha256(model.path),
        requested_precision=args.precision,
        executed_precision=executed,
        bound=accuracy_bound(executed),
        batches=batches,
        device=device,
        timing=timing,
        seed=seed,
        pytorch=pytorch.info,
        versions=_versions(tensorrt_version),
    )

    if tensorrt_version is not None and use_tensorrt:
        engine_plan = _run_tensorrt(args, model, run, pytorch, tensorrt_version)
        if engine_plan is not None:
            write_atomic(args.out, engine_plan)
            run.engine_path = os.path.abspath(args.out)
            run.engine_bytes = len(engine_plan)
        else:
            run.notes.append(f"the engine failed the accuracy check and was not written to {args.out}")
    else:
        _run_onnxruntime(model, run, pytorch, reasons)
        if os.path.exists(args.out):
            run.notes.append(f"{args.out} exists from an earlier run; this run did not write it")

    report = build_report(run)
    path = report_path(args)
    write_atomic(path, (json.dumps(report, indent=2) + "\n").encode())
    _write_termination_summary(termination_summary(report, path))

    for note in run.notes:
        print(note)
    print(format_table(report))
    if run.engine_path:
        print(f"engine: {run.engine_path} ({run.engine_bytes} bytes, TensorRT {tensorrt_version}, {args.precision})")
    print(f"report: {path}")
    if not run.accuracy_passed:
        print(f"dtrain build-engine: error: accuracy check failed: {_accuracy_failure(run)}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    return 0


def _write_termination_summary(summary: str) -> None:
    path = termination_log_path(dict(os.environ))
    if path is None:
        return
    try:
        with open(path, "w") as handle:
            handle.write(summary)
    except OSError as error:
        print(f"dtrain build-engine: warning: cannot write the summary to {path}: {error.strerror}", file=sys.stderr)


def main(args: argparse.Namespace) -> int:
    try:
        return _build_engine(args)
    except EngineError as error:
        print(f"dtrain build-engine: error: {error}", file=sys.stderr)
        return error.exit_code
