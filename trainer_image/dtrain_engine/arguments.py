"""`dtrain build-engine`'s flags: the checks that need neither the model nor a library, and the build options."""

from __future__ import annotations

import argparse
import os

from dtrain_engine.onnx_model import ENGINE_SUFFIXES, check_batch_flags, usage_error
from dtrain_engine.plan import BuildOptions
from dtrain_operator.api import contract


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
