"""`dtrain build-engine`: ONNX -> TensorRT engine, checked against references and timed.

engine_plan decides the whole build (`--dry-run` prints that plan and stops). With TensorRT
and a CUDA GPU the engine is built from it (engine_tensorrt), run on fresh random inputs at
every profile's min, opt and max shapes, compared with ONNX Runtime on the CPU and with the
PyTorch model when one is known, timed with CUDA events next to PyTorch eager, and written
only when the check passes. Without them it stops with a message naming what is missing,
or, with `--fallback onnxruntime`, checks and times the ONNX model with ONNX Runtime on the
CPU and says plainly that no engine was built. A build or run failure is one error line,
with TensorRT's own words, and a report that says the same.
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
from typing import Any

import numpy as np

from dtrain_engine.check import (
    Backend,
    OnnxRuntimeCpu,
    TimingSettings,
    compare_outputs,
    non_finite_outputs,
    random_batch,
)
from dtrain_engine.device import Device
from dtrain_engine.onnx_model import (
    ENGINE_SUFFIXES,
    EXIT_CHECK_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    SUPPORTED_TENSORRT_MAJORS,
    EngineError,
    OnnxModelInfo,
    accuracy_bound,
    check_batch_flags,
    inspect_onnx,
    usage_error,
)
from dtrain_engine.plan import BuildOptions, BuildPlan, ShapePoint, plan_build
from dtrain_engine.pytorch import PyTorchEager, SourceLookup, find_pytorch_source, load_pytorch_model
from dtrain_engine.report import (
    NO_ENGINE_MESSAGE,
    EngineRun,
    TimedPoint,
    build_report,
    cpu_description,
    format_table,
    layer_summary,
    tensor_json,
    termination_log_path,
    termination_summary,
    write_atomic,
)
from dtrain_operator.api import contract

FALLBACK_ONNXRUNTIME = "onnxruntime"


# --- Arguments ----------------------------------------------------------------------------


def check_arguments(args: argparse.Namespace) -> None:
    """Checks that need neither the model nor a library: one clear line each."""
    check_batch_flags(args.min_batch, args.opt_batch, args.max_batch)
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
    counts = {flag: len(values or []) for flag, values in (
        ("--min-shapes", args.min_shapes), ("--opt-shapes", args.opt_shapes), ("--max-shapes", args.max_shapes))}
    if len(set(counts.values())) > 1:
        raise usage_error(
            "give --min-shapes, --opt-shapes and --max-shapes once per optimisation profile each, got "
            + ", ".join(f"{flag} x{count}" for flag, count in counts.items())
        )
    if args.tensorrt_version is not None and not args.dry_run:
        raise usage_error("--tensorrt-version plans a --dry-run; a build uses the TensorRT installed here")


def _layer_precisions(values: list[str] | None) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in (part.strip() for value in values or [] for part in value.split(",") if part.strip()):
        pattern, _, precision = item.rpartition(":")
        pairs.append((pattern, precision))
    return tuple(pairs)


def build_options(args: argparse.Namespace) -> BuildOptions:
    """The flags as engine_plan takes them."""
    return BuildOptions(
        precision=args.precision,
        min_batch=args.min_batch,
        opt_batch=args.opt_batch,
        max_batch=args.max_batch,
        shapes=tuple(zip(args.min_shapes or [], args.opt_shapes or [], args.max_shapes or [])),
        workspace_mib=args.workspace_mib,
        tf32=args.tf32,
        hardware_compatibility=args.hardware_compatibility_level,
        version_compatible=args.version_compatible,
        refit=args.refit,
        strip_weights=args.strip_weights,
        builder_optimization_level=args.builder_optimization_level,
        layer_precisions=_layer_precisions(args.layer_precisions),
        precision_constraints=args.precision_constraints,
        plugin_libraries=tuple(args.plugin_library or []),
        cuda_graph=args.use_cuda_graph,
        timing_cache=args.timing_cache,
    )


def report_path(args: argparse.Namespace) -> str:
    """--report, or the report file next to the engine."""
    if args.report:
        return str(args.report)
    return os.path.join(os.path.dirname(os.path.abspath(args.out)), contract.ENGINE_REPORT_FILE_NAME)


# --- What this machine has -----------------------------------------------------------------


@dataclass(frozen=True)
class Platform:
    """The TensorRT and the CUDA device a build runs on (the tests pass their double's)."""

    tensorrt_version: str
    device: Device


def probe_tensorrt() -> tuple[str | None, str | None]:
    """(TensorRT's version, None) when it can build here, else (None, what is wrong)."""
    try:
        import tensorrt as trt
    except ImportError as error:
        return None, f"TensorRT is not installed (import tensorrt: {error})"
    except Exception as error:  # noqa: BLE001 - e.g. an OSError from a missing libnvinfer
        return None, f"TensorRT does not load ({type(error).__name__}: {str(error).strip().splitlines()[0]})"
    version = getattr(trt, "__version__", None)
    if not isinstance(version, str) or not hasattr(trt, "Builder"):
        # tensorrt-stubs alone makes `import tensorrt` succeed as an empty namespace package.
        return None, "TensorRT is not installed (the `tensorrt` module here holds only type stubs)"
    major = int(version.split(".")[0])
    if major not in SUPPORTED_TENSORRT_MAJORS:
        return None, f"TensorRT {version} is installed, but dtrain builds with TensorRT 10 or 11"
    return version, None


def probe_cuda() -> str | None:
    """None when a CUDA GPU is usable, else why not."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (the engine check takes GPU memory and streams from it)"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    return None


def probe_platform() -> tuple[Platform | None, list[str]]:
    """This machine's TensorRT and GPU, or every reason there is none."""
    tensorrt_version, tensorrt_missing = probe_tensorrt()
    cuda_missing = probe_cuda()
    reasons = [reason for reason in (tensorrt_missing, cuda_missing) if reason]
    if reasons or tensorrt_version is None:
        return None, reasons
    from dtrain_engine.device import TorchCudaDevice

    return Platform(tensorrt_version, TorchCudaDevice()), []


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


def _external_data_records(model: OnnxModelInfo) -> list[dict[str, Any]]:
    """The weights beside a large model's graph: each file hashed, as the graph is."""
    missing = [path for path in model.external_data if not os.path.isfile(path)]
    if missing:
        raise usage_error(f"--onnx {model.path} keeps its weights in {missing}, which is not there")
    return [{"path": path, "sha256": _sha256(path), "bytes": os.path.getsize(path)} for path in model.external_data]


def _versions(tensorrt_version: str | None) -> dict[str, str]:
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


def _load_pytorch(lookup: SourceLookup | None) -> PyTorchModel:
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
    points: list[ShapePoint],
    under_test: Backend,
    references: list[Backend],
    baseline: Backend | None,
) -> None:
    """Fresh random inputs at each profile's shapes: compare with every reference, then time."""
    rng = np.random.default_rng(run.seed)
    run.references = [reference.name for reference in references]
    for point in points:
        batch = random_batch(model, point.shapes, rng)
        outputs = under_test.infer(batch, point.profile)
        where = f"profile {point.profile} {point.label}"
        run.non_finite.extend(f"{name} ({where})" for name in non_finite_outputs(outputs))
        for reference in references:
            expected = reference.infer(batch)
            run.comparisons.append(
                compare_outputs(outputs, expected, reference.name, point.batch_size, run.bound, point.profile, point.label)
            )
        run.latency.append(TimedPoint(point, under_test.measure(batch, point.profile, point.batch_size, run.timing)))
        if baseline is not None:
            run.pytorch_latency.append(TimedPoint(point, baseline.measure(batch, 0, point.batch_size, run.timing)))


def _accuracy_failure(run: EngineRun) -> str:
    if run.non_finite:
        return f"the outputs hold inf/nan: {', '.join(run.non_finite)}"
    failed = [c for c in run.comparisons if not c.passed]
    worst = failed[0]
    where = f"profile {worst.profile} {worst.point} (batch {worst.batch_size})"
    if worst.problem:
        return f"against {worst.reference} at {where}: {worst.problem}"
    return (
        f"max relative error {worst.max_relative_error:.3g} against {worst.reference} at {where} "
        f"is above the {run.executed_precision} bound {run.bound:g}"
    )


# --- The two paths ---------------------------------------------------------------------------


def _run_tensorrt(
    model: OnnxModelInfo, run: EngineRun, pytorch: PyTorchModel, platform: Platform, plan: BuildPlan
) -> bytes | None:
    """Build, check and time the engine; the serialized engine when it passed, else None.

    Whatever TensorRT or the device raises ends here as one EngineError quoting TensorRT's
    log, which the report keeps too."""
    import tempfile

    from dtrain_engine import tensorrt_runtime as engine_tensorrt
    from dtrain_engine.onnx_model import convert_to_float16

    if plan.requested_precision == "bf16" and platform.device.compute_capability < (8, 0):
        raise usage_error(f"--precision bf16 needs a GPU with compute capability 8.0 or newer; this is {run.device}")
    log = engine_tensorrt.TensorRTLog()
    run.tensorrt = {"version": platform.tensorrt_version, "log": log.to_json()}
    try:
        with tempfile.TemporaryDirectory(prefix="dtrain-engine-") as scratch:
            parse_path = model.path
            if plan.onnx_conversion == "float16":
                parse_path = os.path.join(scratch, "model-fp16.onnx")
                convert_to_float16(model.path, parse_path)
            built = engine_tensorrt.build_engine(parse_path, plan, log)
            run.tensorrt.update({"timing_cache": built.timing_cache, "build_seconds": round(built.seconds, 2)})
            engine = engine_tensorrt.TensorRTEngine(built.plan, plan, platform.device, log, parse_path)
            run.tensorrt.update({
                "device_memory_bytes": engine.device_memory_bytes,
                "layers": layer_summary(engine.layer_information()),
            })
            references: list[Backend] = [OnnxRuntimeCpu(model.path)]
            baseline: PyTorchEager | None = None
            if pytorch.model is not None:
                references.append(PyTorchEager(pytorch.model, model, "cpu"))
                autocast = {"fp16": "float16", "bf16": "bfloat16"}.get(plan.requested_precision)
                baseline = PyTorchEager(copy.deepcopy(pytorch.model), model, platform.device.torch_device, autocast)
                pytorch.info["mode"] = baseline.mode
            _check_and_time(run, model, plan.points(), engine, references, baseline)
            run.notes.extend(engine.notes)
    except EngineError:
        raise
    except Exception as error:  # the bindings, the converter and torch.cuda raise their own types
        detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise EngineError(f"{type(error).__name__}: {detail}; {log.failure('finish')}") from error
    finally:
        run.tensorrt["log"] = log.to_json()
    return built.plan if run.accuracy_passed else None


def _run_onnxruntime(
    model: OnnxModelInfo, run: EngineRun, pytorch: PyTorchModel, reasons: list[str], points: list[ShapePoint]
) -> None:
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
    baseline: Backend | None = None
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
    _check_and_time(run, model, points, OnnxRuntimeCpu(model.path), references, baseline)


# --- The command --------------------------------------------------------------------------------


def _dry_run(args: argparse.Namespace, model: OnnxModelInfo, options: BuildOptions, platform: Platform | None) -> int:
    version = args.tensorrt_version or (platform.tensorrt_version if platform else probe_tensorrt()[0])
    plan = plan_build(model, options, version)
    document = {
        "onnx": {
            "path": model.path,
            "inputs": tensor_json(model.inputs),
            "outputs": tensor_json(model.outputs),
            "external_data": list(model.external_data),
        },
        **plan.to_json(),
    }
    print(json.dumps(document, indent=2))
    return 0


def _build_engine(args: argparse.Namespace, platform: Platform | None) -> int:
    check_arguments(args)
    options = build_options(args)
    model = inspect_onnx(args.onnx)
    if args.dry_run:
        return _dry_run(args, model, options, platform)
    reasons: list[str] = []
    if platform is None:
        platform, reasons = probe_platform()
    # Planned for the TensorRT here; without one, for the default version: the profiles and exact
    # outputs are what the fallback checks, and a bad flag is a usage error either way.
    plan = plan_build(model, options, platform.tensorrt_version if platform else None)
    if platform is None and args.fallback != FALLBACK_ONNXRUNTIME:
        raise unavailable_error(reasons)
    lookup = None if args.no_baseline else find_pytorch_source(args.onnx, args.pytorch_checkpoint, args.model_config)
    for warning in lookup.warnings if lookup else []:
        print(f"dtrain build-engine: warning: {warning}", file=sys.stderr)
    external_data = _external_data_records(model)

    pytorch = _load_pytorch(lookup)
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    timing = TimingSettings(warmup=args.warmup, iterations=args.iterations, max_seconds=args.max_seconds)
    executed = plan.executed_precision if platform else model.exported_precision
    run = EngineRun(
        backend="tensorrt" if platform else OnnxRuntimeCpu.name,
        onnx=model,
        onnx_sha256=_sha256(model.path),
        onnx_external_data=external_data,
        requested_precision=args.precision,
        executed_precision=executed,
        bound=plan.bound if platform else accuracy_bound(executed),
        plan=plan,
        device=platform.device.name if platform else cpu_description(os.cpu_count() or 1),
        compute_capability=list(platform.device.compute_capability) if platform else None,
        timing=timing,
        seed=seed,
        pytorch=pytorch.info,
        versions=_versions(platform.tensorrt_version if platform else None),
    )

    exit_code = 0
    if platform is not None:
        try:
            engine_plan = _run_tensorrt(model, run, pytorch, platform, plan)
        except EngineError as error:
            if error.exit_code == EXIT_USAGE:
                raise
            run.error, exit_code, engine_plan = str(error), error.exit_code, None
        if engine_plan is not None:
            write_atomic(args.out, engine_plan)
            run.engine_path = os.path.abspath(args.out)
            run.engine_bytes = len(engine_plan)
        elif run.error is None:
            run.notes.append(f"the engine failed the accuracy check and was not written to {args.out}")
    else:
        _run_onnxruntime(model, run, pytorch, reasons, plan.points())
        if os.path.exists(args.out):
            run.notes.append(f"{args.out} exists from an earlier run; this run did not write it")

    report = build_report(run)
    path = report_path(args)
    write_atomic(path, (json.dumps(report, indent=2) + "\n").encode())
    _write_termination_summary(termination_summary(report, path))

    if run.error is not None:
        print(f"dtrain build-engine: error: {run.error}", file=sys.stderr)
        print(f"report: {path}")
        return exit_code
    for note in run.notes:
        print(note)
    print(format_table(report))
    if run.engine_path:
        print(f"engine: {run.engine_path} ({run.engine_bytes} bytes, TensorRT {platform.tensorrt_version if platform else ''}, {args.precision})")
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


def run(args: argparse.Namespace, platform: Platform | None = None) -> int:
    """`dtrain build-engine` on `platform` (default: the TensorRT and GPU this machine has)."""
    try:
        return _build_engine(args, platform)
    except EngineError as error:
        print(f"dtrain build-engine: error: {error}", file=sys.stderr)
        return error.exit_code


def main(args: argparse.Namespace) -> int:
    return run(args)
