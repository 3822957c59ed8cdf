"""The engine report (schema dtrain.dev/engine-report/v2), typed: the JSON document `dtrain build-engine`
writes next to the engine (dtrain_engine.report builds it), which `dtrain run`'s summary reads.

Its wire names are snake_case, as schema v2 has always spelled them. The parts nobody reads back
(the ONNX model's description, the build plan, TensorRT's layer summary, the timing settings) stay
free-form objects; what the summary and the termination message are made of is typed.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from dtrain_operator.api.records import WireRecord

REPORT_SCHEMA = "dtrain.dev/engine-report/v2"


class ReportPart(WireRecord):
    """A part of the report: snake_case on the wire; an unmeasurable speed (a zero median) is written as Infinity."""

    model_config = ConfigDict(alias_generator=None, allow_inf_nan=True)


class LatencyStats(ReportPart):
    """One backend's timing at one batch size."""

    batch_size: int | None = None
    median_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    images_per_second: float | None = None
    iterations: int | None = None
    warmup: int | None = None
    clock: str | None = None


class LatencyRow(LatencyStats):
    """The engine's timing at one profile's shapes, beside PyTorch eager's."""

    profile: int | None = None
    point: str | None = None
    shapes: dict[str, list[int]] | None = None
    also_measured: list[LatencyStats] | None = None
    pytorch: LatencyStats | None = None
    speedup_vs_pytorch: float | None = None


class Comparison(ReportPart):
    """The engine's outputs against one reference at one profile's shapes."""

    reference: str | None = None
    profile: int | None = None
    point: str | None = None
    batch_size: int | None = None
    max_relative_error: float | None = None
    bound: float | None = None
    compared_exactly: list[str] | None = None
    passed: bool | None = None
    problem: str | None = None


class Accuracy(ReportPart):
    metric: str | None = None
    bound: float | None = None
    references: list[str] | None = None
    comparisons: list[Comparison] | None = None
    non_finite_outputs: list[str] | None = None
    passed: bool | None = None


class Precisions(ReportPart):
    requested: str | None = None
    executed: str | None = None


class BatchSizes(ReportPart):
    min: int | None = None
    opt: int | None = None
    max: int | None = None


class EngineReport(ReportPart):
    """Everything one `dtrain build-engine` run found."""

    report_schema: str | None = Field(default=None, alias="schema")
    """REPORT_SCHEMA (named so on the wire; `schema` is a name pydantic's BaseModel keeps)."""
    created_at: str | None = None
    passed: bool | None = None
    error: str | None = None
    """What TensorRT (or the device) said when the build or a run failed."""
    backend: str | None = None
    """tensorrt, or onnxruntime-cpu where no TensorRT could run."""
    engine: str | None = None
    engine_bytes: int | None = None
    onnx: dict[str, Any] | None = None
    precision: Precisions | None = None
    batch_sizes: BatchSizes | None = None
    profiles: list[dict[str, Any]] | None = None
    device: str | None = None
    compute_capability: list[int] | None = None
    plan: dict[str, Any] | None = None
    tensorrt: dict[str, Any] | None = None
    accuracy: Accuracy | None = None
    latency: list[LatencyRow] | None = None
    pytorch: dict[str, Any] | None = None
    timing: dict[str, Any] | None = None
    notes: list[str] | None = None
    """Why no engine was built, first, when none was."""
    versions: dict[str, str] | None = None
