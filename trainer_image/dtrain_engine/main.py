"""`dtrain build-engine`: ONNX -> TensorRT engine, checked against references and timed.

build_plan.py decides the whole build (`--dry-run` prints that plan and stops). With TensorRT
and a CUDA GPU the engine is built from it (tensorrt_runtime), run on fresh random inputs at
every profile's min, opt and max shapes, compared with ONNX Runtime on the CPU and with the
PyTorch model when one is known, timed with CUDA events next to PyTorch eager, and written
only when the check passes. Without them it stops with a message naming what is missing,
or, with `--fallback onnxruntime`, checks and times the ONNX model with ONNX Runtime on the
CPU and says plainly that no engine was built. A build or run failure is one error line,
with TensorRT's own words, and a report that says the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import sys
from importlib import metadata
from typing import Any

from dtrain_engine import staging
from dtrain_engine.arguments import build_options, check_arguments, report_path
from dtrain_engine.backend_runs import PyTorchModel, accuracy_failure, load_pytorch, run_onnxruntime, run_tensorrt
from dtrain_engine.build_plan import BuildPlan, plan_build
from dtrain_engine.check import OnnxRuntimeCpu, TimingSettings
from dtrain_engine.onnx_model import (
    EXIT_CHECK_FAILED,
    EXIT_USAGE,
    EngineError,
    OnnxModelInfo,
    accuracy_bound,
    inspect_onnx,
    usage_error,
)
from dtrain_engine.probe import Platform, probe_platform, probe_tensorrt, unavailable_error
from dtrain_engine.pytorch import find_pytorch_source
from dtrain_engine.report import (
    EngineRun,
    build_report,
    cpu_description,
    format_table,
    tensor_json,
    termination_log_path,
    termination_summary,
    write_atomic,
)
from dtrain_operator.api.engine_options import EngineBuildOptions

FALLBACK_ONNXRUNTIME = "onnxruntime"


# --- What the report records of the inputs ----------------------------------------------


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


# --- The command --------------------------------------------------------------------------------


def _dry_run(args: argparse.Namespace, model: OnnxModelInfo, options: EngineBuildOptions, platform: Platform | None) -> int:
    version = args.tensorrt_version or (platform.tensorrt_version if platform else probe_tensorrt()[0])
    plan = plan_build(model, options, version, args.timing_cache)
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
    plan = plan_build(model, options, platform.tensorrt_version if platform else None, args.timing_cache)
    if platform is None and options.fallback != FALLBACK_ONNXRUNTIME:
        raise unavailable_error(reasons)
    lookup = None if args.no_baseline else find_pytorch_source(args.onnx, args.pytorch_checkpoint, args.model_config)
    for warning in lookup.warnings if lookup else []:
        print(f"dtrain build-engine: warning: {warning}", file=sys.stderr)
    external_data = _external_data_records(model)

    pytorch = load_pytorch(lookup)
    run = _new_run(args, model, external_data, plan, platform, pytorch)
    exit_code = 0
    if platform is not None:
        exit_code = _build_check_and_write(args, model, run, pytorch, platform, plan)
    else:
        run_onnxruntime(model, run, pytorch, reasons, plan.points())
        if os.path.exists(args.out):
            run.notes.append(f"{args.out} exists from an earlier run; this run did not write it")

    report = build_report(run)
    path = report_path(args)
    write_atomic(path, (json.dumps(report, indent=2) + "\n").encode())
    _write_termination_summary(termination_summary(report, path))
    return _print_outcome(args, run, report, path, platform, exit_code)


def _new_run(
    args: argparse.Namespace,
    model: OnnxModelInfo,
    external_data: list[dict[str, Any]],
    plan: BuildPlan,
    platform: Platform | None,
    pytorch: PyTorchModel,
) -> EngineRun:
    """The run's record before anything is built: what it checks, on what, in which precision."""
    seed = args.seed if args.seed is not None else secrets.randbits(32)
    timing = TimingSettings(warmup=args.warmup, iterations=args.iterations, max_seconds=args.max_seconds)
    executed = plan.executed_precision if platform else model.exported_precision
    return EngineRun(
        backend="tensorrt" if platform else OnnxRuntimeCpu.name,
        onnx=model,
        onnx_sha256=_sha256(model.path),
        onnx_external_data=external_data,
        requested_precision=plan.requested_precision,
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


def _build_check_and_write(
    args: argparse.Namespace,
    model: OnnxModelInfo,
    run: EngineRun,
    pytorch: PyTorchModel,
    platform: Platform,
    plan: BuildPlan,
) -> int:
    """The TensorRT path: the engine is written only when it passed; the exit code of a failed build or run."""
    try:
        engine_plan = run_tensorrt(model, run, pytorch, platform, plan)
    except EngineError as error:
        if error.exit_code == EXIT_USAGE:
            raise
        run.error = str(error)
        return error.exit_code
    if engine_plan is not None:
        write_atomic(args.out, engine_plan)
        run.engine_path = os.path.abspath(args.out)
        run.engine_bytes = len(engine_plan)
    else:
        run.notes.append(f"the engine failed the accuracy check and was not written to {args.out}")
    return 0


def _print_outcome(
    args: argparse.Namespace,
    run: EngineRun,
    report: dict[str, Any],
    path: str,
    platform: Platform | None,
    exit_code: int,
) -> int:
    """The notes, the table and where the files are, or the error; the command's exit code."""
    if run.error is not None:
        print(f"dtrain build-engine: error: {run.error}", file=sys.stderr)
        print(f"report: {path}")
        return exit_code
    for note in run.notes:
        print(note)
    print(format_table(report))
    if run.engine_path:
        print(f"engine: {run.engine_path} ({run.engine_bytes} bytes, TensorRT {platform.tensorrt_version if platform else ''}, {run.requested_precision})")
    print(f"report: {path}")
    if not run.accuracy_passed:
        print(f"dtrain build-engine: error: accuracy check failed: {accuracy_failure(run)}", file=sys.stderr)
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
        if staging.needs_staging(args):
            # Object storage: the build runs on staged local copies (see staging).
            build = lambda local: _build_engine(local, platform)
            return staging.run_staged(args, build, termination_log_path(dict(os.environ)))
        return _build_engine(args, platform)
    except EngineError as error:
        print(f"dtrain build-engine: error: {error}", file=sys.stderr)
        return error.exit_code


def main(args: argparse.Namespace) -> int:
    return run(args)
