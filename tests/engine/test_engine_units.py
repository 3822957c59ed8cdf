"""The pure parts of the engine check: the error metric, latency statistics, batch-size
resolution and the report's summary and table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dtrain_engine.check import (
    Comparison,
    TimingSettings,
    compare_outputs,
    max_relative_error,
    measure_alternately,
    measure_latency,
    summarize_latencies,
)
from dtrain_engine.onnx_model import BatchSizes, EngineError, OnnxModelInfo, TensorInfo, resolve_batch_sizes
from dtrain_engine.report import (
    EngineRun,
    build_report,
    format_table,
    termination_log_path,
    termination_summary,
)
from dtrain_operator.api import contract


def test_max_relative_error_is_scaled_by_the_largest_reference_value() -> None:
    reference = np.array([[10.0, -0.001], [2.0, 0.0]])
    output = reference + np.array([[0.0, 0.01], [0.0, 0.0]])
    assert max_relative_error(output, reference) == pytest.approx(0.01 / 10.0)
    assert max_relative_error(reference, reference) == 0.0
    assert max_relative_error(np.array([np.nan]), np.array([1.0])) == float("inf")
    assert max_relative_error(np.array([np.inf]), np.array([1.0])) == float("inf")


def test_compare_outputs_reports_the_worst_output_and_shape_mismatches() -> None:
    ref = {"a": np.ones((2, 3)), "b": np.full((2,), 4.0)}
    out = {"a": np.ones((2, 3)) * 1.002, "b": np.full((2,), 4.0)}
    comparison = compare_outputs(out, ref, "pytorch", 2, 1e-3)
    assert comparison.max_relative_error == pytest.approx(2e-3)
    assert not comparison.passed

    mismatch = compare_outputs({"a": np.ones((2, 4)), "b": ref["b"]}, ref, "pytorch", 2, 1e-3)
    assert not mismatch.passed and "shape [2, 4], the reference [2, 3]" in mismatch.problem
    assert "missing" in compare_outputs({"a": ref["a"]}, ref, "pytorch", 2, 1e-3).problem
    assert "non-finite" in compare_outputs({**ref, "b": np.array([np.nan, 1.0])}, ref, "pytorch", 2, 1e-3).problem


def test_latency_summary() -> None:
    samples = [0.001] * 98 + [0.002, 0.010]  # 100 runs of 1 ms, one of 2 ms, one of 10 ms
    stats = summarize_latencies(samples, batch_size=8, warmup=3)
    assert stats.median_ms == pytest.approx(1.0)
    assert 1.0 < stats.p99_ms <= 10.0
    assert stats.images_per_second == pytest.approx(8000.0)
    assert (stats.iterations, stats.warmup) == (100, 3)


class FakeClock:
    """Each run takes `step` seconds of fake time."""

    def __init__(self, step: float):
        self.now, self.step, self.runs = 0.0, step, 0

    def __call__(self) -> float:
        return self.now

    def run(self) -> None:
        self.runs += 1
        self.now += self.step


def test_measure_latency_stops_at_the_iteration_count() -> None:
    clock = FakeClock(0.001)
    stats = measure_latency(clock.run, 4, TimingSettings(warmup=3, iterations=20, max_seconds=10), clock)
    assert (stats.warmup, stats.iterations, clock.runs) == (3, 20, 23)
    assert stats.median_ms == pytest.approx(1.0)


def test_measure_latency_keeps_to_the_time_budget_with_a_minimum_of_runs() -> None:
    clock = FakeClock(2.0)  # a slow CPU fallback: 2 s per batch, 3 s budget
    stats = measure_latency(clock.run, 32, TimingSettings(warmup=10, iterations=100, max_seconds=3), clock)
    assert stats.warmup == 1
    assert stats.iterations == 5


def test_two_backends_timed_alternately_each_get_their_own_numbers_and_take_turns() -> None:
    clock, order = FakeClock(0.0), []

    def backend(name: str, seconds: float):
        def run() -> None:
            order.append(name)
            clock.now += seconds
        return run

    fast, slow = measure_alternately([backend("ort", 0.001), backend("eager", 0.004)], 8,
                                     TimingSettings(warmup=2, iterations=5, max_seconds=10), clock)
    assert order == ["ort", "eager"] * 7  # 2 warm-up rounds, then 5 timed ones, one run of each per round
    assert (fast.warmup, fast.iterations, slow.iterations) == (2, 5, 5)
    assert (fast.median_ms, slow.median_ms) == (pytest.approx(1.0), pytest.approx(4.0))


def test_alternate_timing_keeps_to_each_ones_time_budget() -> None:
    clock = FakeClock(2.0)  # 2 s per run of each, 3 s budget each: the pair stops after the minimum of runs
    first, second = measure_alternately([clock.run, clock.run], 32, TimingSettings(warmup=10, iterations=100,
                                                                                  max_seconds=3), clock)
    assert (first.warmup, first.iterations, second.iterations) == (1, 5, 5)


@pytest.mark.parametrize(
    "flags, expected",
    [
        ((None, None, None), BatchSizes(1, 32, 32)),
        ((None, None, 8), BatchSizes(1, 8, 8)),
        ((2, 4, 8), BatchSizes(2, 4, 8)),
        ((None, 64, None), BatchSizes(1, 64, 64)),
        ((64, None, None), BatchSizes(64, 64, 64)),
    ],
)
def test_dynamic_batch_defaults(flags, expected: BatchSizes) -> None:
    assert resolve_batch_sizes(_model(static_batch=None), *flags) == expected


def test_static_batch_defaults_to_its_batch_and_refuses_others() -> None:
    assert resolve_batch_sizes(_model(static_batch=8), None, None, None) == BatchSizes(8, 8, 8)
    assert resolve_batch_sizes(_model(static_batch=8), 8, 8, 8) == BatchSizes(8, 8, 8)
    with pytest.raises(EngineError, match="static batch size of 8.*--opt-batch 4 does not fit") as raised:
        resolve_batch_sizes(_model(static_batch=8), None, 4, None)
    assert raised.value.exit_code == 2


def test_distinct_batch_sizes() -> None:
    assert BatchSizes(1, 32, 32).distinct() == [1, 32]
    assert BatchSizes(4, 4, 4).distinct() == [4]


def _model(static_batch: int | None) -> OnnxModelInfo:
    first = static_batch if static_batch is not None else "batch"
    image = TensorInfo("images", "float32", (first, 3, 32, 32))
    logits = TensorInfo("logits", "float32", (first, 10))
    return OnnxModelInfo("m.onnx", (image,), (logits,), 17, static_batch, frozenset(), frozenset({"float32"}))


def _run(notes: list[str]) -> EngineRun:
    from dtrain_engine.build_plan import plan_build
    from dtrain_engine.check import LatencyStats, Timing
    from dtrain_engine.report import TimedPoint
    from dtrain_operator.api.engine_options import EngineBuildOptions

    model = _model(None)
    plan = plan_build(model, EngineBuildOptions(precision="fp32", min_batch=1, max_batch=8))
    run = EngineRun(
        backend="onnxruntime-cpu", onnx=model, onnx_sha256="0" * 64, requested_precision="fp16",
        executed_precision="fp32", bound=1e-3, plan=plan, device="CPU", timing=TimingSettings(),
        seed=1, notes=notes,
    )
    points = plan.points()
    run.references = ["pytorch"]
    run.comparisons = [Comparison("pytorch", p.batch_size, 1e-7, 1e-3, profile=0, point=p.label) for p in points]
    run.latency = [TimedPoint(p, Timing(LatencyStats(b, 10, 100, 0.5 * b, 0.6 * b, 0.55 * b))) for p, b in zip(points, (1, 8))]
    run.pytorch_latency = [TimedPoint(p, Timing(LatencyStats(b, 10, 100, 1.0 * b, 1.2 * b, 1.1 * b))) for p, b in zip(points, (1, 8))]
    return run


def test_termination_summary_fits_in_four_kib_even_with_long_notes() -> None:
    report = build_report(_run(["No TensorRT engine was built: " + "x" * 10_000]))
    text = termination_summary(report, "/artifacts/engine-report.json")
    assert len(text.encode()) <= contract.TERMINATION_MESSAGE_MAX_BYTES
    summary = json.loads(text)
    assert summary["engine"] is None and summary["passed"] is True
    assert summary["latency"][1] == [8, 4.0, 4.8, 2000.0, 2.0]


def test_table_shows_speedup_and_error_per_batch() -> None:
    table = format_table(build_report(_run([])))
    lines = table.splitlines()
    assert "speed-up" in lines[0]
    assert lines[2].split()[:4] == ["0", "opt/max", "8", "onnxruntime-cpu"] and "2.00x" in lines[2] and "1.00e-07" in lines[2]
    assert lines[-1] == "accuracy passed: bound 0.001 (fp32) against pytorch"


def test_termination_log_path(tmp_path: Path) -> None:
    assert termination_log_path({contract.ENV_TERMINATION_LOG: str(tmp_path / "log")}) == str(tmp_path / "log")
    default = termination_log_path({})
    assert default in (None, contract.TERMINATION_LOG_PATH)
    if not Path(contract.TERMINATION_LOG_PATH).exists():
        assert default is None  # outside a pod nothing is created under /dev
