"""`dtrain build-engine`'s flags: the checks that need neither the model nor a library, and the build options
(api.engine_options reads them into spec.engine's model)."""

from __future__ import annotations

import argparse
import os

from dtrain_engine.onnx_model import ENGINE_SUFFIXES, check_batch_flags, usage_error
from dtrain_operator.api import contract, engine_options
from dtrain_operator.api.engine_options import EngineBuildOptions


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
    if args.tensorrt_version is not None and not args.dry_run:
        raise usage_error("--tensorrt-version plans a --dry-run; a build uses the TensorRT installed here")


def build_options(args: argparse.Namespace) -> EngineBuildOptions:
    """The build options the flags give, checked by spec.engine's own model."""
    try:
        return engine_options.from_flags(args)
    except engine_options.BuildFlagError as error:
        raise usage_error(str(error)) from None


def report_path(args: argparse.Namespace) -> str:
    """--report, or the report file next to the engine."""
    if args.report:
        return str(args.report)
    return os.path.join(os.path.dirname(os.path.abspath(args.out)), contract.ENGINE_REPORT_FILE_NAME)
