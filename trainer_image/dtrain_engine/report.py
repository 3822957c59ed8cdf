"""The engine report: one JSON document next to the engine (dtrain_operator.api.engine_report), a short
summary for the termination log (what the operator copies into status.artifacts, api.results), and a
table for people."""

from __future__ import annotations

import json
import os
import platform
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from dtrain_engine.build_plan import BuildPlan, ShapePoint
from dtrain_engine.check import Comparison, Timing, TimingSettings
from dtrain_engine.onnx_model import OnnxModelInfo
from dtrain_operator.api import contract
from dtrain_operator.api.engine_report import REPORT_SCHEMA, EngineReport
from dtrain_operator.api.results import EngineResults

MAX_REPORTED_LAYERS = 500
ACCURACY_METRIC = (
    "max|y - y_ref| / max|y_ref| over the float outputs of a batch; integer and boolean outputs must be equal"
)
NO_ENGINE_MESSAGE = "No TensorRT engine was built"


@dataclass(frozen=True)
class TimedPoint:
    """One backend's timing at one profile's shapes."""

    point: ShapePoint
    timing: Timing


@dataclass
class EngineRun:
    """Everything one `dtrain build-engine` run found, in the order it found it."""

    backend: str  # "tensorrt" or "onnxruntime-cpu"
    onnx: OnnxModelInfo
    onnx_sha256: str  # the graph file
    requested_precision: str
    executed_precision: str
    bound: float
    plan: BuildPlan
    device: str
    timing: TimingSettings
    seed: int
    onnx_external_data: list[dict[str, Any]] = field(default_factory=list)  # each weights file, hashed
    compute_capability: list[int] | None = None
    engine_path: str | None = None
    engine_bytes: int | None = None
    tensorrt: dict[str, Any] | None = None
    error: str | None = None  # the build or a run failed: what TensorRT (or the device) said
    references: list[str] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    non_finite: list[str] = field(default_factory=list)
    latency: list[TimedPoint] = field(default_factory=list)
    pytorch: dict[str, Any] = field(default_factory=dict)
    pytorch_latency: list[TimedPoint] = field(default_factory=list)
    cpu_threads: int | None = None  # both timed on the CPU: the threads each computed on, the two timed in turn
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def accuracy_passed(self) -> bool:
        return self.error is None and not self.non_finite and all(c.passed for c in self.comparisons)


def tensor_json(tensors: Any) -> list[dict[str, Any]]:
    return [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in tensors]


_DATA_TYPES = re.compile(r"\b(FP32|FP16|Half|BF16|Int8|FP8|Int4|FP4|Int32|Int64|Bool|UInt8|Float)\b", re.IGNORECASE)


def layer_summary(engine_information: str) -> dict[str, Any]:
    """The engine inspector's JSON, cut to what says what ran: each layer's name, type and the data
    types of its outputs, and a count of layers per output type."""
    try:
        document = json.loads(engine_information)
    except ValueError:
        return {"available": False, "reason": "the engine inspector returned no JSON"}
    layers = document.get("Layers", []) if isinstance(document, dict) else []
    if layers and not isinstance(layers[0], dict):
        return {"available": False, "count": len(layers),
                "reason": "layer names only: the engine was built without profiling verbosity DETAILED"}
    rows = []
    counts: dict[str, int] = {}
    for layer in layers:
        types = sorted({match.group(1).upper() for output in layer.get("Outputs", [])
                        for match in [_DATA_TYPES.search(str(output.get("Format/Datatype", "")))] if match})
        for name in types:
            counts[name] = counts.get(name, 0) + 1
        rows.append({"name": layer.get("Name"), "type": layer.get("LayerType"), "output_types": types,
                     "tactic": layer.get("TacticName")})
    return {"available": True, "count": len(rows), "layers_by_output_type": counts, "layers": rows[:MAX_REPORTED_LAYERS]}


def _key(timed: TimedPoint) -> tuple[int, str]:
    return timed.point.profile, timed.point.label


def _latency_rows(run: EngineRun) -> list[dict[str, Any]]:
    """Each shape point's timing, next to PyTorch eager's at the same point and the speedup over it."""
    baseline = {_key(timed): timed.timing.primary for timed in run.pytorch_latency}
    latency = []
    for timed in run.latency:
        stats = timed.timing.primary
        row: dict[str, Any] = {**timed.point.to_json(), **stats.to_json()}
        row["also_measured"] = [other.to_json() for other in timed.timing.others]
        reference = baseline.get(_key(timed))
        row["pytorch"] = reference.to_json() if reference else None
        speedup = reference.median_ms / stats.median_ms if reference and stats.median_ms else None
        row["speedup_vs_pytorch"] = round(speedup, 3) if speedup is not None else None
        latency.append(row)
    return latency


def build_report(run: EngineRun, created_at: datetime | None = None) -> dict[str, Any]:
    created = (created_at or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    latency = _latency_rows(run)
    first_input = run.plan.profiles[0][run.onnx.inputs[0].name]
    # Built as the typed report (a field it does not have, or a value of the wrong type, raises), written as JSON.
    return EngineReport.model_validate({
        "schema": REPORT_SCHEMA,
        "created_at": created,
        "passed": run.accuracy_passed,
        "error": run.error,
        "backend": run.backend,
        "engine": run.engine_path,
        "engine_bytes": run.engine_bytes,
        "onnx": {
            "path": run.onnx.path,
            "sha256": run.onnx_sha256,
            "external_data": run.onnx_external_data,
            "opset": run.onnx.opset,
            "dynamic_batch": run.onnx.dynamic_batch,
            "quantized": run.onnx.quantized,
            "quantized_types": sorted(run.onnx.quantized_types),
            "inputs": tensor_json(run.onnx.inputs),
            "outputs": tensor_json(run.onnx.outputs),
        },
        "precision": {"requested": run.requested_precision, "executed": run.executed_precision},
        "batch_sizes": {"min": first_input.min[0], "opt": first_input.opt[0], "max": first_input.max[0]},
        "profiles": [{name: r.to_json() for name, r in profile.items()} for profile in run.plan.profiles],
        "device": run.device,
        "compute_capability": run.compute_capability,
        "plan": run.plan.to_json(),
        "tensorrt": run.tensorrt,
        "accuracy": {
            "metric": ACCURACY_METRIC,
            "bound": run.bound,
            "references": run.references,
            "comparisons": [c.to_json() for c in run.comparisons],
            "non_finite_outputs": run.non_finite,
            "passed": run.accuracy_passed,
        },
        "latency": latency,
        "pytorch": run.pytorch,
        "timing": {
            "warmup": run.timing.warmup,
            "max_iterations": run.timing.iterations,
            "max_seconds_per_measurement": run.timing.max_seconds,
            "inputs": "random standard-normal batches, already in the backend's memory (no host-device copies timed)",
            "speedup": "PyTorch eager's host wall clock over the backend's leading clock (GPU compute time for TensorRT)",
            "seed": run.seed,
            **({"cpu_threads": run.cpu_threads, "order": "the backend and PyTorch eager in turn, one run each per round"}
               if run.cpu_threads is not None else {}),
        },
        "notes": run.notes,
        "versions": run.versions,
    }).to_wire()


def termination_summary(report: dict[str, Any], report_path: str) -> str:
    """A compact JSON summary that fits Kubernetes' termination message limit (4 KiB)."""
    errors = [c["max_relative_error"] for c in report["accuracy"]["comparisons"] if c["max_relative_error"] is not None]
    message = None
    if report["error"] is not None:
        message = report["error"]
    elif report["engine"] is None:
        message = report["notes"][0] if report["notes"] else NO_ENGINE_MESSAGE
    summary = EngineResults(
        kind="engine",
        passed=report["passed"],
        backend=report["backend"],
        engine=report["engine"],
        report=report_path,
        precision=report["precision"]["requested"],
        max_relative_error=max(errors) if errors else None,
        bound=report["accuracy"]["bound"],
        latency=[
            [row["batch_size"], row["median_ms"], row["p99_ms"], row["images_per_second"], row["speedup_vs_pytorch"]]
            for row in report["latency"]
        ],
        **({"message": message} if message is not None else {}),
    ).to_wire()
    text = json.dumps(summary, separators=(",", ":"))
    limit = contract.TERMINATION_MESSAGE_MAX_BYTES
    if len(text.encode()) > limit:
        summary["message"] = summary.get("message", "")[:200]
        summary["latency"] = summary["latency"][:3]
        text = json.dumps(summary, separators=(",", ":"))
    return text.encode()[:limit].decode(errors="ignore")


def termination_log_path(env: dict[str, str]) -> str | None:
    """Where the summary goes: DTRAIN_TERMINATION_LOG when set, else Kubernetes' file when it exists.

    The default path is only written when the kubelet made it, so that a run outside a pod
    never creates a stray /dev/termination-log.
    """
    configured = env.get(contract.ENV_TERMINATION_LOG)
    if configured:
        return configured
    default = contract.TERMINATION_LOG_PATH
    return default if os.path.exists(default) and os.access(default, os.W_OK) else None


def write_atomic(path: str, data: bytes) -> None:
    """Write a whole file or nothing: readers never see half an engine or half a report."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


def cpu_description(threads: int) -> str:
    processor = platform.processor() or platform.machine()
    return f"CPU ({processor}, {threads} threads)"


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(report: dict[str, Any]) -> str:
    """The latency table and the accuracy verdict, for the log."""
    lines = [
        (f"{'profile':>7} {'point':<11} {'batch':>5}  {'backend':<16} {'median ms':>10} {'p99 ms':>9} {'images/s':>10}   "
         f"{'pytorch ms':>10} {'speed-up':>8}  {'max rel err':>11}"),
    ]
    errors: dict[tuple[int, str], float] = {}
    for comparison in report["accuracy"]["comparisons"]:
        value = comparison["max_relative_error"]
        key = (comparison["profile"], comparison["point"])
        errors[key] = max(errors.get(key, 0.0), value if value is not None else float("inf"))
    for row in report["latency"]:
        pytorch = row["pytorch"]
        speedup = row["speedup_vs_pytorch"]
        error = errors.get((row["profile"], row["point"]))
        lines.append(
            f"{row['profile']:>7} {row['point']:<11} {row['batch_size']:>5}  {report['backend']:<16} {row['median_ms']:>10.3f} "
            f"{row['p99_ms']:>9.3f} {row['images_per_second']:>10.1f}   {_number(pytorch['median_ms'] if pytorch else None, 3):>10} "
            f"{(_number(speedup) + 'x') if speedup else '-':>8}  {(f'{error:.2e}' if error is not None else '-'):>11}"
        )
    accuracy = report["accuracy"]
    verdict = "passed" if accuracy["passed"] else "FAILED"
    if accuracy["references"]:
        lines.append(
            f"accuracy {verdict}: bound {accuracy['bound']:g} ({report['precision']['executed']}) "
            f"against {', '.join(accuracy['references'])}"
        )
    else:
        lines.append(f"accuracy {verdict}: outputs checked to be finite only (no independent reference)")
    return "\n".join(lines)
