"""The engine report (schema dtrain.dev/engine-report/v2), typed: the JSON document `dtrain build-engine`
writes next to the engine (dtrain_engine.report builds it), which `dtrain run`'s summary reads.

Its wire names are snake_case, as schema v2 has always spelled them. The parts nobody reads back
(the ONNX model's description, the build plan, TensorRT's layer summary, the timing settings) stay
free-form objects; what the summary and the termination message are made of is typed.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import ConfigDict, Field

from dtrain_operator.api.records import WireRecord

REPORT_SCHEMA = "dtrain.dev/engine-report/v2"


class ReportPart(WireRecord):
    """A part of the report: snake_case on the wire; an unmeasurable speed (a zero median) is written as Infinity."""

    model_config = ConfigDict(alias_generator=None, allow_inf_nan=True)


class LatencyStats(ReportPart):
    """One backend's timing at one batch size."""

    batch_size: Optional[int] = None
    median_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    mean_ms: Optional[float] = None
    images_per_second: Optional[float] = None
    iterations: Optional[int] = None
    warmup: Optional[int] = None
    clock: Optional[str] = None


class LatencyRow(LatencyStats):
    """The engine's timing at one profile's shapes, beside PyTorch eager's."""

    profile: Optional[int] = None
    point: Optional[str] = None
    shapes: Optional[dict[str, list[int]]] = None
    also_measured: Optional[list[LatencyStats]] = None
    pytorch: Optional[LatencyStats] = None
    speedup_vs_pytorch: Optional[float] = None


class Comparison(ReportPart):
    """The engine's outputs against one reference at one profile's shapes."""

    reference: Optional[str] = None
    profile: Optional[int] = None
    point: Optional[str] = None
    batch_size: Optional[int] = None
    max_relative_error: Optional[float] = None
    bound: Optional[float] = None
    compared_exactly: Optional[list[str]] = None
    passed: Optional[bool] = None
    problem: Optional[str] = None


class Accuracy(ReportPart):
    metric: Optional[str] = None
    bound: Optional[float] = None
    references: Optional[list[str]] = None
    comparisons: Optional[list[Comparison]] = None
    non_finite_outputs: Optional[list[str]] = None
    passed: Optional[bool] = None


class Precisions(ReportPart):
    requested: Optional[str] = None
    executed: Optional[str] = None


class BatchSizes(ReportPart):
    min: Optional[int] = None
    opt: Optional[int] = None
    max: Optional[int] = None


class EngineReport(ReportPart):
    """Everything one `dtrain build-engine` run found."""

    report_schema: Optional[str] = Field(default=None, alias="schema")
    """REPORT_SCHEMA (named so on the wire; `schema` is a name pydantic's BaseModel keeps)."""
    created_at: Optional[str] = None
    passed: Optional[bool] = None
    error: Optional[str] = None
    """What TensorRT (or the device) said when the build or a run failed."""
    backend: Optional[str] = None
    """tensorrt, or onnxruntime-cpu where no TensorRT could run."""
    engine: Optional[str] = None
    engine_bytes: Optional[int] = None
    onnx: Optional[dict[str, Any]] = None
    precision: Optional[Precisions] = None
    batch_sizes: Optional[BatchSizes] = None
    profiles: Optional[list[dict[str, Any]]] = None
    device: Optional[str] = None
    compute_capability: Optional[list[int]] = None
    plan: Optional[dict[str, Any]] = None
    tensorrt: Optional[dict[str, Any]] = None
    accuracy: Optional[Accuracy] = None
    latency: Optional[list[LatencyRow]] = None
    pytorch: Optional[dict[str, Any]] = None
    timing: Optional[dict[str, Any]] = None
    notes: Optional[list[str]] = None
    """Why no engine was built, first, when none was."""
    versions: Optional[dict[str, str]] = None
