"""The two ways `dtrain build-engine` checks a model, and the steps they share.

With TensorRT and a CUDA GPU: build the engine, run it on fresh random inputs at every
profile's shapes, compare it with ONNX Runtime and the PyTorch model, and time it next to
PyTorch eager. Without them (--fallback onnxruntime): check and time the ONNX model with
ONNX Runtime on the CPU.
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from dtrain_engine.build_plan import BuildPlan, ShapePoint
from dtrain_engine.check import (
    Backend,
    OnnxRuntimeCpu,
    Timing,
    compare_outputs,
    measure_alternately,
    non_finite_outputs,
    random_batch,
)
from dtrain_engine.onnx_model import EngineError, OnnxModelInfo, usage_error
from dtrain_engine.probe import Platform
from dtrain_engine.pytorch import PyTorchEager, SourceLookup, load_pytorch_model
from dtrain_engine.report import NO_ENGINE_MESSAGE, EngineRun, TimedPoint, layer_summary


@dataclass
class PyTorchModel:
    """The loaded PyTorch model, or why there is none."""

    model: Any
    info: dict[str, Any]


def load_pytorch(lookup: SourceLookup | None) -> PyTorchModel:
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
    alternately: bool = False,
) -> None:
    """Fresh random inputs at each profile's shapes: compare with every reference, then time; `alternately`
    (both on the CPU's wall clock): the backend and the baseline in turn (check.measure_alternately)."""
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
        if alternately and baseline is not None:
            timed, eager = measure_alternately(
                [under_test.prepare_timed_run(batch), baseline.prepare_timed_run(batch)], point.batch_size, run.timing
            )
            run.latency.append(TimedPoint(point, Timing(timed)))
            run.pytorch_latency.append(TimedPoint(point, Timing(eager)))
            continue
        run.latency.append(TimedPoint(point, under_test.measure(batch, point.profile, point.batch_size, run.timing)))
        if baseline is not None:
            run.pytorch_latency.append(TimedPoint(point, baseline.measure(batch, 0, point.batch_size, run.timing)))


def accuracy_failure(run: EngineRun) -> str:
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


def run_tensorrt(
    model: OnnxModelInfo, run: EngineRun, pytorch: PyTorchModel, platform: Platform, plan: BuildPlan
) -> bytes | None:
    """Build, check and time the engine; the serialized engine when it passed, else None.

    Whatever TensorRT or the device raises ends here as one EngineError quoting TensorRT's
    log, which the report keeps too."""
    import tempfile

    from dtrain_engine import tensorrt_runtime
    from dtrain_engine.onnx_model import convert_to_float16

    if plan.requested_precision == "bf16" and platform.device.compute_capability < (8, 0):
        raise usage_error(f"--precision bf16 needs a GPU with compute capability 8.0 or newer; this is {run.device}")
    log = tensorrt_runtime.TensorRTLog()
    run.tensorrt = {"version": platform.tensorrt_version, "log": log.to_json()}
    try:
        with tempfile.TemporaryDirectory(prefix="dtrain-engine-") as scratch:
            parse_path = model.path
            if plan.onnx_conversion == "float16":
                parse_path = os.path.join(scratch, "model-fp16.onnx")
                convert_to_float16(model.path, parse_path)
            built = tensorrt_runtime.build_engine(parse_path, plan, log)
            run.tensorrt.update({"timing_cache": built.timing_cache, "build_seconds": round(built.seconds, 2)})
            engine = tensorrt_runtime.TensorRTEngine(built.plan, plan, platform.device, log, parse_path)
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


def run_onnxruntime(
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
    threads: int | None = None
    if pytorch.model is not None:
        eager = PyTorchEager(pytorch.model, model, "cpu")
        references.append(eager)
        baseline, threads = eager, eager.cpu_threads
        pytorch.info["mode"] = eager.mode
        # Like with like: ONNX Runtime on PyTorch's threads, the two timed in turn at each shape.
        run.cpu_threads = threads
    else:
        run.notes.append(
            "the outputs were only checked to be finite: with no PyTorch model there is no independent reference "
            "for ONNX Runtime to be compared with"
        )
    _check_and_time(run, model, points, OnnxRuntimeCpu(model.path, threads), references, baseline, alternately=True)
